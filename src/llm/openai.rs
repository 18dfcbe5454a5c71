//! A responder for any OpenAI-compatible chat completions server (OpenAI,
//! OpenRouter, Ollama, vLLM, llama.cpp), through async-openai.
//!
//! lull supplies async-openai's HTTP transport (its middleware seam) so that its own
//! retry policy is the only one that runs ([`super::retry`]), and so that a refused
//! request keeps what the server said: the status, the error message and
//! `Retry-After`.

use std::time::Duration;

use async_openai::Client;
use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::middleware::HttpRequestFactory;
use async_openai::types::chat::{
    ChatCompletionRequestAssistantMessage, ChatCompletionRequestAssistantMessageContent,
    ChatCompletionRequestMessage, ChatCompletionRequestSystemMessage,
    ChatCompletionRequestUserMessage, CreateChatCompletionRequest,
};
use async_trait::async_trait;
use secrecy::{ExposeSecret, SecretString};

use super::{Generation, HistoryBudget, LlmError, Prompt, Responder, merge_turn};
use crate::store::TokenUsage;

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
    /// Longest reply in tokens (`max_tokens`, which every compatible server reads);
    /// the server's default when unset.
    pub max_tokens: Option<u32>,
    /// How much earlier conversation is sent.
    pub history: HistoryBudget,
    /// One request's time limit.
    pub timeout: Duration,
}

/// Calls `POST {base}/chat/completions`, one request per attempt.
pub struct OpenAiResponder {
    client: Client<OpenAIConfig>,
    settings: OpenAiSettings,
}

/// A non-success answer of the model server, passed through async-openai intact.
#[derive(Debug, thiserror::Error)]
#[error("HTTP {status}: {message}")]
struct HttpFailure {
    status: u16,
    message: String,
    retry_after: Option<Duration>,
}

/// `Retry-After` in seconds (the form model servers use).
fn retry_after(headers: &reqwest_openai::header::HeaderMap) -> Option<Duration> {
    headers
        .get(reqwest_openai::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
}

/// The `error.message` of an OpenAI-style error body, else the start of the body.
fn error_message(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| body.chars().take(200).collect())
}

impl OpenAiResponder {
    pub fn new(settings: OpenAiSettings) -> Result<Self, String> {
        let http = reqwest_openai::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("cannot build the model server client: {e}"))?;
        let transport = tower::service_fn(move |factory: HttpRequestFactory| {
            let http = http.clone();
            async move {
                let request = factory.build().await?;
                // Errors carry no URL: some deployments put a key in the base URL.
                let response = http
                    .execute(request)
                    .await
                    .map_err(|e| OpenAIError::Reqwest(e.without_url()))?;
                if response.status().is_success() {
                    return Ok(response);
                }
                let status = response.status().as_u16();
                let retry_after = retry_after(response.headers());
                let body = response.text().await.unwrap_or_default();
                Err(OpenAIError::Boxed(Box::new(HttpFailure {
                    status,
                    message: error_message(&body),
                    retry_after,
                })))
            }
        });
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
            client: Client::with_config(config).with_http_service(transport),
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
            ChatCompletionRequestSystemMessage::from(self.settings.system_prompt.as_str()).into(),
        );
        for exchange in history {
            let user = merge_turn(
                exchange.user.iter().map(|(a, t)| (a.as_str(), t.as_str())),
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
        messages.push(ChatCompletionRequestUserMessage::from(prompt.user_turn().as_str()).into());
        messages
    }

    /// The server's model list (for `lull check`).
    pub async fn list_models(&self) -> Result<Vec<String>, LlmError> {
        let models = self.client.models();
        let list = tokio::time::timeout(self.settings.timeout, models.list())
            .await
            .map_err(|_| LlmError::Timeout(self.settings.timeout))?
            .map_err(|e| classify(e, self.settings.timeout))?;
        Ok(list.data.into_iter().map(|m| m.id).collect())
    }

    pub fn settings(&self) -> &OpenAiSettings {
        &self.settings
    }
}

#[async_trait]
impl Responder for OpenAiResponder {
    fn name(&self) -> &'static str {
        "openai"
    }

    async fn respond(&self, prompt: &Prompt) -> Result<Generation, LlmError> {
        // `max_tokens` is deprecated by OpenAI in favour of `max_completion_tokens`, but it
        // is the one field every compatible server (Ollama, vLLM, llama.cpp) reads.
        #[allow(deprecated)]
        let request = CreateChatCompletionRequest {
            model: self.settings.model.clone(),
            messages: self.messages(prompt),
            temperature: self.settings.temperature,
            max_tokens: self.settings.max_tokens,
            ..Default::default()
        };
        let chat = self.client.chat();
        let response = tokio::time::timeout(self.settings.timeout, chat.create(request))
            .await
            .map_err(|_| LlmError::Timeout(self.settings.timeout))?
            .map_err(|e| classify(e, self.settings.timeout))?;
        let text = response
            .choices
            .into_iter()
            .next()
            .and_then(|c| c.message.content)
            .unwrap_or_default();
        // An empty answer is a failure, never a reply.
        if text.trim().is_empty() {
            return Err(LlmError::Empty);
        }
        Ok(Generation {
            text,
            usage: response.usage.map(|u| TokenUsage {
                prompt: u64::from(u.prompt_tokens),
                completion: u64::from(u.completion_tokens),
            }),
        })
    }
}

fn classify(error: OpenAIError, timeout: Duration) -> LlmError {
    match error {
        OpenAIError::Boxed(boxed) => match boxed.downcast::<HttpFailure>() {
            Ok(failure) => LlmError::Status {
                status: failure.status,
                message: failure.message,
                retry_after: failure.retry_after,
            },
            Err(other) => LlmError::Connect(other.to_string()),
        },
        OpenAIError::ApiError(e) => LlmError::Status {
            status: e.status_code.as_u16(),
            message: e.api_error.message,
            retry_after: None,
        },
        OpenAIError::JSONDeserialize(e, _) => LlmError::Malformed(e.to_string()),
        OpenAIError::Reqwest(e) if e.is_timeout() => LlmError::Timeout(timeout),
        OpenAIError::Reqwest(e) if e.is_decode() => LlmError::Malformed(e.to_string()),
        other => LlmError::Connect(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_yield_their_message() {
        assert_eq!(
            error_message(
                r#"{"error":{"message":"model not found","type":"invalid_request_error"}}"#
            ),
            "model not found"
        );
        assert_eq!(error_message("upstream timeout"), "upstream timeout");
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

//! A responder for any OpenAI-compatible chat completions server (OpenAI,
//! OpenRouter, Ollama, vLLM, llama.cpp), through async-openai.

use std::time::Duration;

use async_openai::Client;
use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::types::chat::{
    ChatCompletionRequestAssistantMessage, ChatCompletionRequestAssistantMessageContent,
    ChatCompletionRequestMessage, ChatCompletionRequestSystemMessage,
    ChatCompletionRequestUserMessage, CreateChatCompletionRequest,
};
use async_trait::async_trait;
use secrecy::{ExposeSecret, SecretString};

use super::{Generation, LlmError, Prompt, Responder, merge_turn};
use crate::store::TokenUsage;

/// How to reach the model.
#[derive(Debug, Clone)]
pub struct OpenAiSettings {
    /// The API base, e.g. `https://api.openai.com/v1` or `http://localhost:11434/v1`.
    pub base_url: String,
    /// Optional: local servers accept requests without one.
    pub api_key: Option<SecretString>,
    pub model: String,
    pub system_prompt: String,
    /// One request's limit; the dispatcher's lease is renewed meanwhile.
    pub timeout: Duration,
}

/// Calls `POST {base}/chat/completions` once per batch.
pub struct OpenAiResponder {
    client: Client<OpenAIConfig>,
    settings: OpenAiSettings,
}

impl OpenAiResponder {
    pub fn new(settings: OpenAiSettings) -> Self {
        let mut config = OpenAIConfig::new().with_api_base(settings.base_url.trim_end_matches('/'));
        // An empty key sends no usable credential; local servers ignore it.
        config = config.with_api_key(
            settings
                .api_key
                .as_ref()
                .map(|k| k.expose_secret().to_owned())
                .unwrap_or_default(),
        );
        Self {
            client: Client::with_config(config),
            settings,
        }
    }

    /// The messages sent for a prompt: system prompt, history (oldest first), then
    /// the merged pending messages as one user turn.
    pub fn messages(&self, prompt: &Prompt) -> Vec<ChatCompletionRequestMessage> {
        let mut messages: Vec<ChatCompletionRequestMessage> =
            Vec::with_capacity(2 + 2 * prompt.history.len());
        messages.push(
            ChatCompletionRequestSystemMessage::from(self.settings.system_prompt.as_str()).into(),
        );
        for exchange in &prompt.history {
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
}

#[async_trait]
impl Responder for OpenAiResponder {
    fn name(&self) -> &'static str {
        "openai"
    }

    async fn respond(&self, prompt: &Prompt) -> Result<Generation, LlmError> {
        let request = CreateChatCompletionRequest {
            model: self.settings.model.clone(),
            messages: self.messages(prompt),
            ..Default::default()
        };
        let chat = self.client.chat();
        let response = tokio::time::timeout(self.settings.timeout, chat.create(request))
            .await
            .map_err(|_| LlmError::Timeout(self.settings.timeout))?
            .map_err(classify)?;
        let text = response
            .choices
            .into_iter()
            .next()
            .and_then(|c| c.message.content)
            .unwrap_or_default();
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

fn classify(error: OpenAIError) -> LlmError {
    match error {
        OpenAIError::ApiError(e) => LlmError::Status {
            status: e.status_code.as_u16(),
            message: e.api_error.message,
            retry_after: None,
        },
        OpenAIError::JSONDeserialize(e, _) => LlmError::Malformed(e.to_string()),
        OpenAIError::Reqwest(e) if e.is_timeout() => LlmError::Timeout(Duration::ZERO),
        // reqwest's message carries the URL, never the key (it travels in a header).
        other => LlmError::Connect(other.to_string()),
    }
}

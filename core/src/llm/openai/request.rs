//! Building the request for a prompt: the system prompt, the history that fits its
//! budget, the pending batch as one user turn (with its images), the tool turns of
//! this round, the offered tools, and the reply's token cap under the field name the
//! server reads.

use async_openai::types::chat::{
    ChatCompletionMessageToolCall, ChatCompletionMessageToolCalls,
    ChatCompletionRequestAssistantMessage, ChatCompletionRequestAssistantMessageContent,
    ChatCompletionRequestMessage, ChatCompletionRequestMessageContentPartImage,
    ChatCompletionRequestMessageContentPartText, ChatCompletionRequestSystemMessage,
    ChatCompletionRequestToolMessage, ChatCompletionRequestToolMessageContent,
    ChatCompletionRequestUserMessage, ChatCompletionRequestUserMessageContent,
    ChatCompletionRequestUserMessageContentPart, ChatCompletionTool, ChatCompletionTools,
    CreateChatCompletionRequest, FunctionCall, FunctionObject, ImageUrl,
};

use super::OpenAiResponder;
use crate::llm::{Prompt, merge_turn};

impl OpenAiResponder {
    /// The messages sent for a prompt: the system prompt, the history that fits the
    /// budget (oldest first), then the pending messages merged into one user turn.
    pub fn messages(&self, prompt: &Prompt) -> Vec<ChatCompletionRequestMessage> {
        let history = self.settings.history.fit(&prompt.history, prompt.is_group);
        let mut messages: Vec<ChatCompletionRequestMessage> =
            Vec::with_capacity(2 + 2 * history.len());
        messages
            .push(ChatCompletionRequestSystemMessage::from(self.system(prompt).as_str()).into());
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
        // Group context in a message of its own: overheard text never shares the turn
        // (or its structure) with what lull answers.
        if let Some(context) = prompt.context_turn() {
            messages.push(ChatCompletionRequestUserMessage::from(context.as_str()).into());
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

    /// The system message: the chat's (or the configured) system prompt, then what the
    /// model remembers here (lull's words around it, each memory quoted).
    fn system(&self, prompt: &Prompt) -> String {
        let system = prompt
            .choices
            .system_prompt
            .as_deref()
            .unwrap_or(&self.settings.system_prompt);
        // The system prompt, then what the model remembers, then the summary of the
        // conversation before the history that follows.
        [
            Some(system),
            prompt.memories.as_deref(),
            prompt.summary.as_deref(),
        ]
        .into_iter()
        .flatten()
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join("\n\n")
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

    /// The request for a prompt (not streamed).
    pub(super) fn request(&self, prompt: &Prompt) -> CreateChatCompletionRequest {
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
}

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

/// Whether the base URL is OpenAI's own API.
fn is_openai(base_url: &str) -> bool {
    url::Url::parse(base_url).is_ok_and(|u| u.host_str() == Some("api.openai.com"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openais_own_api_gets_max_completion_tokens() {
        assert!(is_openai("https://api.openai.com/v1"));
        assert!(!is_openai("http://localhost:11434/v1"));
        assert!(!is_openai("https://openrouter.ai/api/v1"));
    }
}

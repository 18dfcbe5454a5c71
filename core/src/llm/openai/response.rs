//! Reading the model's answer: a whole JSON answer, or a streamed one put together
//! piece by piece (its text shown in the [`Partial`] as it arrives, its tool calls
//! assembled by index), with the time limit on the first piece and every pause after.
//!
//! Either way an answer with neither text nor tool calls is [`LlmError::Empty`], and
//! one the model stopped at its token limit ends with [`CUT_NOTE`].

use async_openai::error::OpenAIError;
use async_openai::types::chat::{
    ChatCompletionMessageToolCallChunk, ChatCompletionMessageToolCalls,
    ChatCompletionStreamOptions, CreateChatCompletionRequest, CreateChatCompletionResponse,
    FinishReason,
};
use futures_util::StreamExt;

use super::OpenAiResponder;
use super::errors::classify;
use crate::domain::TokenUsage;
use crate::llm::{Generation, LlmError, Partial, ToolCall};
use crate::metrics as names;

/// Ends a reply the model stopped at its token limit, so the user can tell it is
/// unfinished.
pub const CUT_NOTE: &str = "\n\n[the model stopped here: the reply reached its length limit]";

/// What a streamed request brought.
pub(super) enum Streamed {
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

/// A whole JSON answer to a streamed request: the server does not stream (some
/// OpenAI-compatible servers ignore `stream`). Its body is the reply.
#[derive(Debug, thiserror::Error)]
#[error("the model server answered a streamed request with one whole answer")]
pub(super) struct WholeAnswer(pub(super) String);

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
        usage: response.usage.map(|u| usage_of(&u)),
        tool_calls,
    })
}

/// The usage a server reported: prompt and completion tokens, and the prompt's
/// tokens read from its cache when it says so (priced apart, `LULL_PRICES`).
fn usage_of(u: &async_openai::types::chat::CompletionUsage) -> TokenUsage {
    TokenUsage {
        prompt: u64::from(u.prompt_tokens),
        completion: u64::from(u.completion_tokens),
        cached: u
            .prompt_tokens_details
            .as_ref()
            .and_then(|d| d.cached_tokens)
            .map_or(0, u64::from),
    }
}

/// The note for a reply cut at the token limit, counted (`lull_replies_cut_total`).
fn cut_note() -> &'static str {
    metrics::counter!(names::REPLIES_CUT).increment(1);
    CUT_NOTE
}

impl OpenAiResponder {
    /// One request, answered whole.
    pub(super) async fn whole(
        &self,
        request: CreateChatCompletionRequest,
    ) -> Result<Generation, LlmError> {
        let limit = self.settings.timeout;
        let chat = self.client.chat();
        let response = tokio::time::timeout(limit, chat.create(request))
            .await
            .map_err(|_| LlmError::Timeout(limit))?
            .map_err(|e| classify(e, limit))?;
        whole_generation(response)
    }

    /// One request, streamed: each piece is shown in `partial` as it arrives.
    pub(super) async fn streamed(
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
                usage = Some(usage_of(&u));
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

#[cfg(test)]
mod tests {
    use super::*;

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
}

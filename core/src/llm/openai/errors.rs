//! Sorting a failure of the model server into an [`LlmError`]: a refusal's status,
//! message and `Retry-After` read from its body, a prompt too long for the model
//! recognised in every form OpenAI-compatible servers give it, an exhausted quota told
//! from a rate limit, and a refusal of `stream` told from any other.
//!
//! Invariant: every text quoting the server is redacted before it is kept, so no
//! error built here carries the key.

use std::time::Duration;

use async_openai::error::OpenAIError;

use crate::llm::LlmError;

/// A non-success answer of the model server, passed through async-openai intact
/// (its message already redacted).
#[derive(Debug, thiserror::Error)]
#[error("HTTP {status}: {message}")]
pub(in crate::llm) struct HttpFailure {
    status: u16,
    pub(in crate::llm) message: String,
    retry_after: Option<Duration>,
    context_length: bool,
    out_of_credit: bool,
}

impl HttpFailure {
    /// What a non-success answer says. The whole body is redacted before any of it is
    /// kept, so a cut can never leave half a key behind.
    pub(in crate::llm) fn read(status: u16, retry_after: Option<Duration>, body: &str) -> Self {
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
pub(super) fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    lull_port::retry::parse_retry_after(value, std::time::SystemTime::now())
}

/// Whether a refusal of a streamed request is about streaming (a server that does
/// not support `stream` or `stream_options`): asking for a whole answer may work.
pub(super) fn refuses_streaming(error: &LlmError) -> bool {
    matches!(
        error,
        LlmError::Status { status, message, .. }
            if (400..500).contains(status)
                && !matches!(status, 401 | 403 | 404 | 408 | 429)
                && message.to_lowercase().contains("stream")
    )
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

/// The failure as lull sorts it. Errors keep their cause chain (which socket error,
/// which TLS problem), redacted.
pub(super) fn classify(error: OpenAIError, timeout: Duration) -> LlmError {
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
    use secrecy::SecretString;

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
    fn retry_after_reads_seconds() {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::RETRY_AFTER, "2".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
        headers.insert(reqwest::header::RETRY_AFTER, "soon".parse().unwrap());
        assert_eq!(retry_after(&headers), None);
    }
}

//! Which models refused `tools`, remembered for a while: a model without tool support
//! answers every request that offers tools with a 4xx, so once it said so, later rounds
//! ask it without them instead of paying a refusal each.
//!
//! Invariant: a refusal is remembered only when it names tools (a 4xx for another
//! reason — a prompt too long, a bad parameter — says nothing about tool support), only
//! for the model that refused (another `/model` still gets its tools), and only for
//! [`REMEMBERED_FOR`] (a server upgraded to tool support is asked again without a
//! restart).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::llm::LlmError;

/// How long a model's refusal of tools is remembered.
pub(super) const REMEMBERED_FOR: Duration = Duration::from_secs(600);

/// Models that refused tools, each until when (module docs).
#[derive(Debug, Default)]
pub(crate) struct ToolRefusals {
    /// Why a std mutex: held for a map lookup or insert, never across an await.
    until: Mutex<HashMap<String, Instant>>,
}

impl ToolRefusals {
    /// Whether `model` refused tools less than [`REMEMBERED_FOR`] before `now`.
    pub(crate) fn refused(&self, model: &str, now: Instant) -> bool {
        let mut until = self.until.lock().expect("not poisoned");
        match until.get(model) {
            Some(end) if *end > now => true,
            Some(_) => {
                until.remove(model);
                false
            }
            None => false,
        }
    }

    /// Remember that `model` refused the tools with `error`, if the error names them;
    /// `true` when it is remembered now and was not before (to log it once).
    pub(crate) fn record(&self, model: &str, error: &LlmError, now: Instant) -> bool {
        if !names_tools(error) {
            return false;
        }
        let mut until = self.until.lock().expect("not poisoned");
        let known = until.get(model).is_some_and(|end| *end > now);
        until.insert(model.to_owned(), now + REMEMBERED_FOR);
        !known
    }
}

/// Whether a refusal may be about the tools offered, so the turn is worth asking again
/// without them: one naming tools or functions; a 400 or 422 about the request's shape
/// that names something else lull handles on its own (images) excepted; a prompt too
/// long (the tools' definitions count in it). Never a 401, 403 or 404 (the key, the
/// model or the URL): lull's own tools are offered on every request, so asking those
/// again would double every refused request.
pub(crate) fn may_be_the_tools(error: &LlmError) -> bool {
    match error {
        LlmError::OutOfCredit { .. } => false,
        LlmError::ContextLength { .. } => true,
        LlmError::Status {
            status: 400 | 422, ..
        } => names_tools(error) || !error.to_string().to_lowercase().contains("image"),
        _ => names_tools(error),
    }
}

/// Whether a refusal's text names tools ("tools are not supported", "function calling
/// is not enabled", "tool_choice"…).
fn names_tools(error: &LlmError) -> bool {
    let text = error.to_string().to_lowercase();
    ["tool", "function"].iter().any(|word| text.contains(word))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(message: &str) -> LlmError {
        LlmError::Status {
            status: 400,
            message: message.to_owned(),
            retry_after: None,
        }
    }

    #[test]
    fn a_refusal_about_the_key_or_the_model_is_never_put_on_the_tools() {
        let status = |status: u16, message: &str| LlmError::Status {
            status,
            message: message.to_owned(),
            retry_after: None,
        };
        assert!(may_be_the_tools(&status(400, "fake failure 400")));
        assert!(may_be_the_tools(&status(
            404,
            "this model does not support tools"
        )));
        assert!(!may_be_the_tools(&status(401, "invalid api key")));
        assert!(!may_be_the_tools(&status(404, "model not found")));
        assert!(!may_be_the_tools(&status(
            400,
            "Invalid content type. image_url is only supported by certain models."
        )));
    }

    #[test]
    fn only_a_refusal_naming_tools_is_remembered_per_model_and_for_a_while() {
        let refusals = ToolRefusals::default();
        let now = Instant::now();
        assert!(!refusals.record("small", &refusal("prompt too long"), now));
        assert!(
            !refusals.refused("small", now),
            "a 4xx about something else"
        );
        assert!(refusals.record("small", &refusal("tools are not supported"), now));
        assert!(!refusals.record("small", &refusal("tools are not supported"), now));
        assert!(refusals.refused("small", now + Duration::from_secs(1)));
        assert!(
            !refusals.refused("big", now),
            "another model keeps its tools"
        );
        assert!(
            !refusals.refused("small", now + REMEMBERED_FOR),
            "asked again after a while"
        );
    }
}

//! The LLM seam: the dispatcher calls a [`Responder`] once per batch.
//!
//! Two responders: [`echo::EchoResponder`], offline, which reports what it was given
//! (for trying lull out and for tests), and [`openai::OpenAiResponder`], for any
//! OpenAI-compatible server.

pub mod echo;
pub mod openai;

use std::time::Duration;

use async_trait::async_trait;

use crate::domain::ConversationRef;
use crate::store::{Exchange, PendingMessage, TokenUsage};

/// What the model is asked: the recent history, then every pending message merged
/// into one user turn.
#[derive(Debug, Clone)]
pub struct Prompt {
    pub conversation: ConversationRef,
    /// In groups each line of a user turn carries its author's name.
    pub is_group: bool,
    pub history: Vec<Exchange>,
    pub batch: Vec<PendingMessage>,
}

impl Prompt {
    /// The pending messages as one user turn.
    pub fn user_turn(&self) -> String {
        merge_turn(
            self.batch
                .iter()
                .map(|m| (m.author.as_str(), m.text.as_str())),
            self.is_group,
        )
    }
}

/// Merge messages into one user turn: one message per line, `author: text` in groups.
pub fn merge_turn<'a>(
    messages: impl IntoIterator<Item = (&'a str, &'a str)>,
    is_group: bool,
) -> String {
    messages
        .into_iter()
        .map(|(author, text)| {
            if is_group {
                format!("{author}: {text}")
            } else {
                text.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A reply from the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generation {
    pub text: String,
    pub usage: Option<TokenUsage>,
}

/// Why the model gave no reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LlmError {
    #[error("the model did not answer within {0:?}")]
    Timeout(Duration),
    #[error("cannot reach the model server: {0}")]
    Connect(String),
    #[error("the model server answered HTTP {status}: {message}")]
    Status {
        status: u16,
        message: String,
        retry_after: Option<Duration>,
    },
    #[error("the model server sent a response lull cannot read: {0}")]
    Malformed(String),
    #[error("the model returned an empty reply")]
    Empty,
}

/// Something that turns a prompt into a reply.
#[async_trait]
pub trait Responder: Send + Sync + 'static {
    /// A short name for logs and metrics (`echo`, `openai`).
    fn name(&self) -> &'static str;

    async fn respond(&self, prompt: &Prompt) -> Result<Generation, LlmError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_turns_carry_author_names() {
        let msgs = [("Ann", "hi"), ("Bob", "hello")];
        assert_eq!(merge_turn(msgs, true), "Ann: hi\nBob: hello");
        assert_eq!(merge_turn(msgs, false), "hi\nhello");
    }
}

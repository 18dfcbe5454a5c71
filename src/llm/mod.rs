//! The LLM seam: the dispatcher calls a [`Responder`] once per batch.
//!
//! Two responders: [`echo::EchoResponder`], offline, which reports what it was given
//! (for trying lull out and for tests), and [`openai::OpenAiResponder`], for any
//! OpenAI-compatible server.

pub mod echo;
pub mod openai;
pub mod retry;

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

/// Why the model gave no reply. [`LlmError::is_retryable`] sorts the failures worth
/// another attempt (the server was slow, unreachable, overloaded or glitched) from
/// those that will fail the same way again (a request the server refuses).
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

impl LlmError {
    /// Timeouts, connection errors, 429, 5xx, unreadable or empty answers: yes.
    /// Other 4xx (bad key, unknown model, malformed request): no.
    pub fn is_retryable(&self) -> bool {
        match self {
            LlmError::Status { status, .. } => *status == 429 || *status == 408 || *status >= 500,
            LlmError::Timeout(_)
            | LlmError::Connect(_)
            | LlmError::Malformed(_)
            | LlmError::Empty => true,
        }
    }

    /// How long the server asked us to wait (`Retry-After`), if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            LlmError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The `outcome` label of `lull_llm_requests_total`.
    pub fn outcome(&self) -> &'static str {
        match self {
            LlmError::Timeout(_) => "timeout",
            LlmError::Empty => "empty",
            LlmError::Status { status: 429, .. } => "rate_limited",
            _ => "error",
        }
    }
}

/// How much earlier conversation the model sees: at most `messages` earlier
/// messages (user turns and replies count one each) and `chars` characters of them.
/// Whole exchanges are kept or dropped, newest kept first, so a reply is never
/// offered without the question it answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryBudget {
    pub messages: usize,
    pub chars: usize,
}

impl HistoryBudget {
    /// The exchanges of `history` (oldest first) that fit, oldest first.
    pub fn fit<'h>(&self, history: &'h [Exchange], is_group: bool) -> &'h [Exchange] {
        let (mut messages, mut chars, mut start) = (0, 0, history.len());
        for (i, exchange) in history.iter().enumerate().rev() {
            let size = crate::split::char_len(&merge_turn(
                exchange.user.iter().map(|(a, t)| (a.as_str(), t.as_str())),
                is_group,
            )) + crate::split::char_len(&exchange.reply);
            if messages + 2 > self.messages || chars + size > self.chars {
                break;
            }
            messages += 2;
            chars += size;
            start = i;
        }
        &history[start..]
    }

    /// How many exchanges to read from the store to fill the budget.
    pub fn exchanges(&self) -> usize {
        self.messages.div_ceil(2)
    }
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

    fn exchange(user: &str, reply: &str) -> Exchange {
        Exchange {
            user: vec![("Ann".into(), user.into())],
            reply: reply.into(),
        }
    }

    #[test]
    fn the_history_budget_keeps_the_newest_whole_exchanges() {
        let history = vec![
            exchange("q1", "a1"),
            exchange("q2", "a2"),
            exchange("q3", "a3"),
        ];
        let by_count = HistoryBudget {
            messages: 4,
            chars: 1000,
        };
        assert_eq!(by_count.fit(&history, false), &history[1..]);
        // Each exchange is 4 characters: 9 fit two of them.
        let by_chars = HistoryBudget {
            messages: 100,
            chars: 9,
        };
        assert_eq!(by_chars.fit(&history, false), &history[1..]);
        let none = HistoryBudget {
            messages: 1,
            chars: 1000,
        };
        assert!(none.fit(&history, false).is_empty());
        assert_eq!(
            HistoryBudget {
                messages: 5,
                chars: 0
            }
            .exchanges(),
            3
        );
    }

    #[test]
    fn retryable_failures_are_the_transient_ones() {
        let status = |status| LlmError::Status {
            status,
            message: String::new(),
            retry_after: None,
        };
        assert!(
            status(429).is_retryable() && status(500).is_retryable() && status(503).is_retryable()
        );
        assert!(
            !status(400).is_retryable()
                && !status(401).is_retryable()
                && !status(404).is_retryable()
        );
        assert!(LlmError::Empty.is_retryable() && LlmError::Connect("x".into()).is_retryable());
    }

    #[test]
    fn group_turns_carry_author_names() {
        let msgs = [("Ann", "hi"), ("Bob", "hello")];
        assert_eq!(merge_turn(msgs, true), "Ann: hi\nBob: hello");
        assert_eq!(merge_turn(msgs, false), "hi\nhello");
    }
}

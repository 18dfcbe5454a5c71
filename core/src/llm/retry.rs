//! Retrying a responder, and metering every attempt.
//!
//! Timeouts, connection errors, 429, 5xx and unreadable or empty answers are retried
//! with exponential backoff and jitter, honouring the server's `Retry-After`; other
//! 4xx are not. The caller (a round) renews its lease meanwhile. When the retries are
//! spent the error goes up: the round keeps the messages pending, tells the user
//! once, and the conversation is tried again later with a growing backoff.

use std::time::{Duration, Instant};

use async_trait::async_trait;

use lull_port::Backoff;

use super::{Generation, LlmError, Partial, Prompt, Responder};
use crate::metrics as names;

/// How hard to try within one round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts after the first.
    pub retries: u32,
    /// Waits between attempts (the port's one backoff policy).
    pub backoff: Backoff,
    /// The longest wait within a round: a server asking for more (`Retry-After`)
    /// ends the round, and the conversation's own backoff honours the request.
    pub max_wait: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            retries: 3,
            backoff: Backoff::new(Duration::from_millis(500), Duration::from_secs(60)),
            max_wait: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (1-based) after `error`, or `None` to
    /// stop retrying.
    pub fn wait(&self, retry: u32, error: &LlmError) -> Option<Duration> {
        if retry > self.retries || !error.is_retryable() {
            return None;
        }
        let wait = self.backoff.delay_honouring(retry, error.retry_after());
        (wait <= self.max_wait).then_some(wait)
    }
}

/// Wraps a responder with the retry policy and per-attempt metrics
/// (`lull_llm_requests_total{outcome}`, `lull_llm_seconds`, `lull_llm_tokens_total{kind}`).
pub struct Retrying<R> {
    inner: R,
    policy: RetryPolicy,
}

impl<R: Responder> Retrying<R> {
    pub fn new(inner: R, policy: RetryPolicy) -> Self {
        Self { inner, policy }
    }
}

#[async_trait]
impl<R: Responder> Responder for Retrying<R> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn models(&self) -> Result<Vec<String>, LlmError> {
        self.inner.models().await
    }

    async fn respond(&self, prompt: &Prompt, partial: &Partial) -> Result<Generation, LlmError> {
        /// Counts the request in flight as `cancelled` (and its time) if it is dropped
        /// before its answer.
        struct InFlight(Option<Instant>);
        impl Drop for InFlight {
            fn drop(&mut self) {
                if let Some(started) = self.0 {
                    metrics::histogram!(names::LLM_SECONDS).record(started.elapsed().as_secs_f64());
                    metrics::counter!(names::LLM_REQUESTS, "outcome" => "cancelled").increment(1);
                }
            }
        }
        let mut retry = 0;
        loop {
            let started = Instant::now();
            // A request dropped before its answer (an overtaken generation stopped, a
            // lost lease, a stop) is still a request: counted `cancelled` on drop.
            let mut in_flight = InFlight(Some(started));
            let result = self.inner.respond(prompt, partial).await;
            in_flight.0 = None;
            metrics::histogram!(names::LLM_SECONDS).record(started.elapsed().as_secs_f64());
            let error = match result {
                Ok(generation) => {
                    metrics::counter!(names::LLM_REQUESTS, "outcome" => "ok").increment(1);
                    if let Some(usage) = generation.usage {
                        metrics::counter!(names::LLM_TOKENS, "kind" => "prompt")
                            .increment(usage.prompt);
                        metrics::counter!(names::LLM_TOKENS, "kind" => "completion")
                            .increment(usage.completion);
                    }
                    return Ok(generation);
                }
                Err(error) => error,
            };
            metrics::counter!(names::LLM_REQUESTS, "outcome" => error.outcome()).increment(1);
            retry += 1;
            let Some(wait) = self.policy.wait(retry, &error) else {
                return Err(error);
            };
            tracing::warn!(
                conversation = %prompt.conversation,
                attempt = retry,
                error = %error,
                retry_in_ms = wait.as_millis() as u64,
                "model request failed; retrying"
            );
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(status: u16, retry_after: Option<u64>) -> LlmError {
        LlmError::Status {
            status,
            message: String::new(),
            retry_after: retry_after.map(Duration::from_secs),
        }
    }

    #[test]
    fn waits_grow_with_jitter_and_stop_after_the_retries() {
        let policy = RetryPolicy::default();
        for _ in 0..100 {
            let first = policy.wait(1, &status(503, None)).unwrap();
            assert!(first >= Duration::from_millis(375) && first <= Duration::from_millis(625));
            let third = policy.wait(3, &status(503, None)).unwrap();
            assert!(third >= Duration::from_millis(1500) && third <= Duration::from_millis(2500));
        }
        assert_eq!(policy.wait(4, &status(503, None)), None);
    }

    #[test]
    fn retry_after_is_honoured_and_client_errors_are_not_retried() {
        let policy = RetryPolicy::default();
        assert!(policy.wait(1, &status(429, Some(7))).unwrap() >= Duration::from_secs(7));
        assert_eq!(
            policy.wait(1, &status(429, Some(3600))),
            None,
            "too long for a round"
        );
        assert_eq!(policy.wait(1, &status(400, None)), None);
        assert_eq!(policy.wait(1, &status(401, None)), None);
    }
}

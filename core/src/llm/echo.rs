//! The offline responder: replies with how many messages it received and each of
//! them verbatim, after an optional artificial delay (`LULL_ECHO_DELAY_MS`) that lets
//! tests provoke races. When someone watches (live drafts), it streams the reply word
//! by word, spread over the same delay.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;

use super::{Generation, LlmError, Partial, Prompt, Responder};

/// `LULL_ECHO_DELAY_MS`: a fixed delay `N` or a uniformly random one `MIN..MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EchoDelay {
    min_ms: u64,
    max_ms: u64,
}

impl EchoDelay {
    pub fn fixed(ms: u64) -> Self {
        Self {
            min_ms: ms,
            max_ms: ms,
        }
    }

    /// One delay drawn from the range.
    pub fn sample(&self) -> Duration {
        Duration::from_millis(fastrand::u64(self.min_ms..=self.max_ms))
    }
}

impl FromStr for EchoDelay {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let number = |n: &str| {
            n.trim().parse::<u64>().map_err(|_| {
                format!(
                    "LULL_ECHO_DELAY_MS must be milliseconds `N` or a range `MIN..MAX`, got '{s}'"
                )
            })
        };
        let delay = match s.split_once("..") {
            Some((min, max)) => Self {
                min_ms: number(min)?,
                max_ms: number(max)?,
            },
            None => Self::fixed(number(s)?),
        };
        if delay.min_ms > delay.max_ms {
            return Err(format!(
                "LULL_ECHO_DELAY_MS: the range '{s}' ends before it starts"
            ));
        }
        Ok(delay)
    }
}

/// Replies `[echo] N message(s):` followed by each message on its own line.
#[derive(Debug, Clone, Default)]
pub struct EchoResponder {
    delay: EchoDelay,
}

impl EchoResponder {
    pub fn new(delay: EchoDelay) -> Self {
        Self { delay }
    }
}

#[async_trait]
impl Responder for EchoResponder {
    fn name(&self) -> &'static str {
        "echo"
    }

    async fn respond(&self, prompt: &Prompt, partial: &Partial) -> Result<Generation, LlmError> {
        let n = prompt.batch.len();
        let plural = if n == 1 { "" } else { "s" };
        let turn = match prompt.context_turn() {
            Some(context) => format!("{context}\n\n{}", prompt.user_turn()),
            None => prompt.user_turn(),
        };
        let text = format!("[echo] {n} message{plural}:\n{turn}");
        let delay = self.delay.sample();
        if partial.is_watched() {
            stream_words(&text, delay, partial).await;
        } else {
            tokio::time::sleep(delay).await;
        }
        Ok(Generation::text(text, None))
    }
}

/// Show `text` in `partial` one word (with the spaces after it) at a time, the words
/// evenly spread over `delay`: the whole text is shown when the delay is over.
async fn stream_words(text: &str, delay: Duration, partial: &Partial) {
    partial.restart();
    let words: Vec<&str> = text.split_inclusive(char::is_whitespace).collect();
    let step = delay / u32::try_from(words.len().max(1)).unwrap_or(u32::MAX);
    for word in words {
        tokio::time::sleep(step).await;
        partial.push(word);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{ConversationRef, Platform, Said};

    /// Time is a source of non-determinism: paused, it advances only when every task
    /// waits, so the word steps are exact.
    #[tokio::test(start_paused = true)]
    async fn watched_it_streams_word_by_word_over_its_delay() {
        let prompt = Prompt {
            conversation: ConversationRef::new(Platform::Console, "local"),
            is_group: false,
            history: Vec::new(),
            overheard: Vec::new(),
            memories: None,
            summary: None,
            batch: vec![Said::new("Ann", "one two")],
            note: None,
            images: Vec::new(),
            max_tokens: None,
            tools: Vec::new().into(),
            turns: Vec::new(),
            choices: Default::default(),
        };
        let echo = EchoResponder::new(EchoDelay::fixed(500));
        let (partial, mut text) = Partial::watched();
        let started = tokio::time::Instant::now();
        let reply = tokio::spawn(async move { echo.respond(&prompt, &partial).await });
        let mut seen = Vec::new();
        while text.changed().await.is_ok() {
            seen.push(text.borrow_and_update().clone());
        }
        let reply = reply.await.unwrap().unwrap();
        assert_eq!(started.elapsed(), Duration::from_millis(500));
        assert_eq!(
            seen,
            [
                "[echo] ",
                "[echo] 1 ",
                "[echo] 1 message:\n",
                "[echo] 1 message:\none ",
                "[echo] 1 message:\none two"
            ]
        );
        assert_eq!(reply.text, seen[seen.len() - 1]);
    }

    #[test]
    fn delays_parse_as_fixed_or_range() {
        assert_eq!("250".parse::<EchoDelay>().unwrap(), EchoDelay::fixed(250));
        let range: EchoDelay = "100..300".parse().unwrap();
        for _ in 0..100 {
            let d = range.sample().as_millis();
            assert!((100..=300).contains(&d));
        }
        for bad in ["", "x", "5..1", "1..x"] {
            let e = bad.parse::<EchoDelay>().unwrap_err();
            assert!(e.contains("LULL_ECHO_DELAY_MS"), "{e}");
        }
    }
}

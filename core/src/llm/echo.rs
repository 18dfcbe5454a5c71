//! The offline responder: replies with how many messages it received and each of
//! them verbatim, after an optional artificial delay (`LULL_ECHO_DELAY_MS`) that lets
//! tests provoke races.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;

use super::{Generation, LlmError, Prompt, Responder};

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

    async fn respond(&self, prompt: &Prompt) -> Result<Generation, LlmError> {
        tokio::time::sleep(self.delay.sample()).await;
        let n = prompt.batch.len();
        let plural = if n == 1 { "" } else { "s" };
        Ok(Generation {
            text: format!("[echo] {n} message{plural}:\n{}", prompt.user_turn()),
            usage: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

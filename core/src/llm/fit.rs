//! Asking again with less when the server refuses a prompt as too long for the model.
//!
//! After a context-length refusal the prompt shrinks, one model request per step:
//! half the history that was sent, then no history, then the batch itself cut to a
//! half and a quarter of its length, with a note to the model saying what was left
//! out. Steps that would send the same request again are skipped, so a refused batch
//! costs at most [`MAX_SMALLER_PROMPTS`] more requests. When even the smallest is
//! refused the error goes up, and the round tells the user and ends the batch.

use async_trait::async_trait;

use super::{FailureKind, Generation, HistoryBudget, LlmError, Partial, Prompt, Responder};
use crate::domain::Said;
use lull_port::split::{best_cut, byte_index, char_len};

/// The most smaller prompts tried after a refusal: two with less history, two with
/// the batch cut.
pub const MAX_SMALLER_PROMPTS: usize = 4;

/// A batch shorter than this (in characters, after cutting) is not cut further:
/// what does not fit then is the system prompt or the reply's token budget.
const MIN_CUT_BATCH_CHARS: usize = 500;

/// Marks where a message was shortened.
const CUT_MARK: &str = "\n[…]\n";

/// Wraps a responder: a prompt refused as too long is sent again smaller (see the
/// module docs). Every request goes through the inner responder, so each is a real,
/// counted model call.
pub struct Fitting<R> {
    inner: R,
    /// The history budget the responder applies: the history actually sent is what
    /// gets halved.
    history: HistoryBudget,
}

impl<R: Responder> Fitting<R> {
    pub fn new(inner: R, history: HistoryBudget) -> Self {
        Self { inner, history }
    }
}

#[async_trait]
impl<R: Responder> Responder for Fitting<R> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn models(&self) -> Result<Vec<String>, LlmError> {
        self.inner.models().await
    }

    async fn respond(&self, prompt: &Prompt, partial: &Partial) -> Result<Generation, LlmError> {
        let mut error = match self.inner.respond(prompt, partial).await {
            Err(error) if error.kind() == FailureKind::TooLong => error,
            other => return other,
        };
        for smaller in smaller_prompts(prompt, self.history) {
            tracing::warn!(
                conversation = %prompt.conversation,
                error = %error,
                history = smaller.history.len(),
                cut = smaller.note.is_some(),
                "the prompt is too long for the model; asking again with less"
            );
            error = match self.inner.respond(&smaller, partial).await {
                Err(error) if error.kind() == FailureKind::TooLong => error,
                other => return other,
            };
        }
        Err(error)
    }
}

/// The smaller prompts to try, in order, after `prompt` was refused as too long: half
/// the history that was sent, no history, then the batch cut to a half and a quarter
/// of its characters. At most [`MAX_SMALLER_PROMPTS`]; none repeats a request.
pub fn smaller_prompts(prompt: &Prompt, budget: HistoryBudget) -> Vec<Prompt> {
    let sent = budget.fit(&prompt.history, prompt.is_group);
    let mut prompts = Vec::new();
    if sent.len() >= 2 {
        prompts.push(Prompt {
            history: sent[sent.len() - sent.len() / 2..].to_vec(),
            ..prompt.clone()
        });
    }
    if !sent.is_empty() {
        prompts.push(Prompt {
            history: Vec::new(),
            overheard: Vec::new(),
            memories: None,
            summary: None,
            ..prompt.clone()
        });
    }
    let total: usize = prompt.batch.iter().map(|m| char_len(&m.text)).sum();
    for keep in [total / 2, total / 4] {
        if keep < MIN_CUT_BATCH_CHARS {
            break;
        }
        let batch = cut_batch(&prompt.batch, keep);
        let kept: usize = batch.iter().map(|m| char_len(&m.text)).sum();
        prompts.push(Prompt {
            history: Vec::new(),
            overheard: Vec::new(),
            memories: None,
            summary: None,
            batch,
            note: Some(cut_note(total, total.saturating_sub(kept))),
            ..prompt.clone()
        });
    }
    prompts
}

/// What the model is told about a batch that was cut.
fn cut_note(total: usize, left_out: usize) -> String {
    format!(
        "[Note from lull, the chat bot: these messages were too long for you, so {left_out} of their {total} characters were left out where you see […]. Tell the user you could read only part of them.]"
    )
}

/// The batch with its messages cut to about `keep` characters in all: messages
/// shorter than a fair share stay whole, longer ones keep their beginning and end.
fn cut_batch(batch: &[Said], keep: usize) -> Vec<Said> {
    let lengths: Vec<usize> = batch.iter().map(|m| char_len(&m.text)).collect();
    let share = fair_share(&lengths, keep);
    batch
        .iter()
        .zip(lengths)
        .map(|(message, length)| Said {
            text: if length <= share {
                message.text.clone()
            } else {
                shorten(&message.text, share)
            },
            ..message.clone()
        })
        .collect()
}

/// The largest `share` with `sum(min(length, share)) <= keep`: short messages stay
/// whole, and what is left is split evenly among the long ones.
fn fair_share(lengths: &[usize], keep: usize) -> usize {
    let mut sorted = lengths.to_vec();
    sorted.sort_unstable();
    let mut left = keep;
    for (i, &length) in sorted.iter().enumerate() {
        let share = left / (sorted.len() - i);
        if length > share {
            return share;
        }
        left -= length;
    }
    usize::MAX
}

/// About `keep` characters of `text`: two thirds from its beginning, one third from
/// its end (where a question after a long paste usually is), cut at word boundaries.
fn shorten(text: &str, keep: usize) -> String {
    let keep = keep.saturating_sub(char_len(CUT_MARK));
    let head_chars = keep * 2 / 3;
    let tail_chars = keep - head_chars;
    let head_window = &text[..byte_index(text, head_chars)];
    let head = &head_window[..best_cut(head_window)];
    let tail_window = &text[byte_index(text, char_len(text) - tail_chars)..];
    // The first boundary in the first half of the tail window.
    let start = tail_window
        .find(['\n', ' '])
        .filter(|&i| i <= tail_window.len() / 2)
        .map_or(0, |i| i + 1);
    let tail = &tail_window[start..];
    format!("{}{CUT_MARK}{}", head.trim_end(), tail.trim_start())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{ConversationRef, Exchange, Platform};

    fn message(text: &str) -> Said {
        Said::new("Ann", text)
    }

    fn prompt(history: usize, batch: &[&str]) -> Prompt {
        Prompt {
            conversation: ConversationRef::new(Platform::Http, "c"),
            is_group: false,
            history: (0..history)
                .map(|i| Exchange {
                    user: vec![Said::new("Ann", format!("q{i}"))],
                    reply: format!("a{i}"),
                })
                .collect(),
            overheard: Vec::new(),
            memories: None,
            summary: None,
            batch: batch.iter().map(|t| message(t)).collect(),
            note: None,
            images: Vec::new(),
            max_tokens: None,
            tools: Vec::new().into(),
            turns: Vec::new(),
            choices: Default::default(),
        }
    }

    const BUDGET: HistoryBudget = HistoryBudget {
        messages: 100,
        chars: 100_000,
    };

    #[test]
    fn history_goes_first_then_the_batch_is_cut_with_a_note() {
        let long = "word ".repeat(3000); // 15,000 characters
        let p = prompt(4, &[&long, &long, &long, &long]);
        let smaller = smaller_prompts(&p, BUDGET);
        assert_eq!(smaller.len(), MAX_SMALLER_PROMPTS);
        assert_eq!(smaller[0].history, p.history[2..]);
        assert!(smaller[0].note.is_none() && smaller[0].batch == p.batch);
        assert!(smaller[1].history.is_empty() && smaller[1].note.is_none());
        for (step, limit) in [(2, 30_000), (3, 15_000)] {
            let turn = smaller[step].user_turn();
            let batch: usize = smaller[step].batch.iter().map(|m| char_len(&m.text)).sum();
            assert!(batch <= limit && batch > limit * 9 / 10, "{batch}");
            assert!(smaller[step].history.is_empty());
            let note = smaller[step].note.as_deref().unwrap();
            assert!(turn.ends_with(note) && note.contains("60000 characters"));
        }
    }

    #[test]
    fn steps_that_would_repeat_a_request_are_skipped() {
        // One exchange of history: "half" and "none" are the same request.
        let smaller = smaller_prompts(&prompt(1, &["short question"]), BUDGET);
        assert_eq!(smaller.len(), 1);
        assert!(smaller[0].history.is_empty());
        // Nothing to leave out, and a batch too short to cut.
        assert!(smaller_prompts(&prompt(0, &["short question"]), BUDGET).is_empty());
    }

    #[test]
    fn short_messages_stay_whole_and_long_ones_keep_both_ends() {
        let long = format!("BEGIN {}END?", "filler ".repeat(2000));
        let batch = cut_batch(&[message("what is this?"), message(&long)], 3000);
        assert_eq!(batch[0].text, "what is this?");
        let cut = &batch[1].text;
        assert!(
            char_len(cut) <= 3000 - "what is this?".len(),
            "{}",
            char_len(cut)
        );
        assert!(
            cut.starts_with("BEGIN filler") && cut.ends_with("filler END?"),
            "{cut}"
        );
        assert!(cut.contains(CUT_MARK));
        assert_eq!(fair_share(&[10, 100, 1000], 400), 290);
        assert_eq!(fair_share(&[10, 20], 400), usize::MAX);
    }
}

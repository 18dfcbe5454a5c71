//! What a round's model calls spent and what a prompt is estimated to cost: the
//! figures the wallet reserves and settles.

use lull_port::MediaKind;

use super::super::Dispatcher;
use crate::limits::{self, Limits};
use crate::llm::{Generation, Prompt};
use crate::money::{TokenPrice, Usd};
use crate::store::PendingMessage;

/// Tokens a generation spent, by kind (`lull_tokens_total`), and what they cost at
/// the model's price.
#[derive(Debug, Clone, Copy, Default)]
pub(in crate::dispatcher) struct Spent {
    prompt: u64,
    completion: u64,
    estimated: u64,
    cost: Usd,
}

impl std::ops::AddAssign for Spent {
    /// A round of several model turns (tool calls) spends what each turn spent.
    fn add_assign(&mut self, other: Spent) {
        self.prompt += other.prompt;
        self.completion += other.completion;
        self.estimated += other.estimated;
        self.cost.0 = self.cost.0.saturating_add(other.cost.0);
    }
}

impl Spent {
    /// An estimate of `tokens` of prompt at `price`, for a generation stopped before
    /// the server reported its usage.
    pub(in crate::dispatcher) fn estimated(tokens: u64, price: &TokenPrice) -> Spent {
        Spent {
            estimated: tokens,
            cost: price.worst(tokens, 0),
            ..Spent::default()
        }
    }

    /// What `generation` spent at `price`: the model's reported usage (its cached
    /// prompt tokens at the cached price), else an estimate from the prompt and the
    /// reply's text.
    pub(in crate::dispatcher) fn of(
        limits: &Limits,
        price: &TokenPrice,
        prompt: &Prompt,
        generation: &Generation,
    ) -> Spent {
        match generation.usage {
            Some(usage) => Spent {
                prompt: usage.prompt,
                completion: usage.completion,
                estimated: 0,
                cost: price.cost(&usage),
            },
            None => {
                let (input, output) = (
                    prompt_tokens(limits, prompt),
                    limits::text_tokens(&generation.text),
                );
                Spent {
                    estimated: input + output,
                    cost: price.worst(input, output),
                    ..Spent::default()
                }
            }
        }
    }

    pub(in crate::dispatcher) fn total(self) -> u64 {
        self.prompt + self.completion + self.estimated
    }

    pub(in crate::dispatcher) fn cost(self) -> Usd {
        self.cost
    }

    /// The tokens by kind, for `lull_tokens_total`.
    pub(super) fn by_kind(self) -> [(&'static str, u64); 3] {
        [
            ("prompt", self.prompt),
            ("completion", self.completion),
            ("estimated", self.estimated),
        ]
    }
}

/// The prompt's tokens, estimated from above ([`limits::text_tokens`]): the system
/// prompt and what the model remembers, each message's text and framing (history,
/// the batch, the note), the offered tools' definitions, and [`limits::IMAGE_TOKENS`]
/// for each image.
pub(in crate::dispatcher) fn prompt_tokens(limits: &Limits, prompt: &Prompt) -> u64 {
    let said = |author: &str, text: &str| {
        limits::text_tokens(author) + limits::text_tokens(text) + 1 // ": " and the line
    };
    let history: u64 = prompt
        .history
        .iter()
        .map(|e| {
            e.user.iter().map(|s| said(&s.author, &s.text)).sum::<u64>()
                + limits::text_tokens(&e.reply)
                + 2 * limits::MESSAGE_TOKENS
        })
        .sum();
    let batch: u64 = prompt.batch.iter().map(|s| said(&s.author, &s.text)).sum();
    let note = prompt.note.as_deref().map_or(0, limits::text_tokens);
    // What the model remembers and the summary, with the system prompt.
    let memories = prompt.memories.as_deref().map_or(0, limits::text_tokens)
        + prompt.summary.as_deref().map_or(0, limits::text_tokens);
    // The offered tools' definitions, sent with the request.
    let tools: u64 = prompt
        .tools
        .iter()
        .map(|t| {
            limits::text_tokens(&t.name)
                + limits::text_tokens(&t.description)
                + limits::text_tokens(&t.parameters.to_string())
        })
        .sum();
    // Group context is a message of its own.
    let context = prompt
        .context_turn()
        .map_or(0, |c| limits::text_tokens(&c) + limits::MESSAGE_TOKENS);
    limits.system_tokens
        + limits::MESSAGE_TOKENS * 2
        + context
        + history
        + batch
        + note
        + memories
        + tools
        + prompt.images.len() as u64 * limits::IMAGE_TOKENS
}

/// What the media of `messages` will add to the prompt once read, before they are:
/// each image (at most [`limits::MAX_IMAGES_PER_PROMPT`], with vision on), and the
/// transcript of each voice message not transcribed yet.
pub(in crate::dispatcher) fn media_tokens(d: &Dispatcher, messages: &[PendingMessage]) -> u64 {
    let images = if d.settings.vision {
        messages
            .iter()
            .flat_map(|m| &m.media)
            .filter(|m| m.kind == MediaKind::Image)
            .count()
            .min(limits::MAX_IMAGES_PER_PROMPT) as u64
    } else {
        0
    };
    let speech: u64 = messages
        .iter()
        .filter(|m| m.transcript.is_none())
        .filter_map(|m| m.media.iter().find(|m| m.kind.is_audio()))
        .map(|a| {
            u64::from(
                a.duration_secs
                    .unwrap_or(d.settings.max_audio_seconds)
                    .min(d.settings.max_audio_seconds),
            ) * limits::TRANSCRIPT_TOKENS_PER_SECOND
        })
        .sum();
    images * limits::IMAGE_TOKENS + speech
}

/// The batch's authors (user ids), each once, sorted: who a batch is charged to.
pub(in crate::dispatcher) fn authors(messages: &[PendingMessage]) -> Vec<String> {
    let mut authors: Vec<String> = messages.iter().map(|m| m.user_id.clone()).collect();
    authors.sort_unstable();
    authors.dedup();
    authors
}

/// The model `prompt` is asked with: the chat's choice, else the deployment's default.
pub(in crate::dispatcher) fn model_of(d: &Dispatcher, prompt: &Prompt) -> String {
    prompt
        .choices
        .model
        .clone()
        .unwrap_or_else(|| d.settings.controls.default_model.clone())
}

/// The token price of the model `prompt` is asked with (`LULL_PRICES`; nothing for
/// an unpriced model).
pub(in crate::dispatcher) fn price_of(d: &Dispatcher, prompt: &Prompt) -> TokenPrice {
    d.settings.limits.prices.tokens_of(&model_of(d, prompt))
}

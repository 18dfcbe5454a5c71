//! Summaries (`LULL_SUMMARY`): a long conversation keeps its thread through a summary
//! stored as a derived row (`store::SummaryStore`), never by cutting or rewriting a
//! message.
//!
//! - A round is shown the conversation's summary in the system prompt ([`block`]),
//!   then the exchanges after it within the history budget (the store reads only
//!   those).
//! - After a round's reply was delivered and its lease released, [`due`] decides from
//!   what the round read whether the history has filled its window; if so, `maker`
//!   makes the next summary beside the rounds (the person does not wait for it):
//!   under the conversation's summary lease (renewed while it works, expiring if its
//!   process dies), charged to the budgets of the people whose reply asked for it,
//!   stored only if it covers more than the stored one, in the same context. A message
//!   that arrives meanwhile is simply after it; a failure keeps the previous summary.
//! - `cover`: which exchanges a summary covers (the oldest, keeping the newest half of
//!   the window verbatim), `texts`: the request the summary model is sent.

mod cover;
mod maker;
mod texts;

pub(super) use maker::{SummaryAsked, make_later};

use crate::domain::Exchange;
use crate::llm::{HistoryBudget, exchange_chars};
use crate::store::{Batch, Summary};

/// The longest summary kept, in characters: a longer answer is cut at a sentence.
pub const SUMMARY_MAX_CHARS: usize = 4000;
/// The most tokens a summary request may answer with.
pub(super) const SUMMARY_MAX_TOKENS: u64 = 1024;

/// The summaries' settings (`LULL_SUMMARY=on`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummarySettings {
    /// `LULL_SUMMARY_MODEL`: the model that writes summaries; `None`: the chat's model.
    pub model: Option<String>,
    /// The history budget the rounds' prompts are fitted to (`LULL_HISTORY_MESSAGES`,
    /// `LULL_HISTORY_CHARS`): a summary is made when the exchanges after the stored
    /// one no longer leave room in it for the next.
    pub history: HistoryBudget,
}

/// The summary as the system prompt shows it.
pub(super) fn block(summary: &Summary) -> String {
    texts::block(summary)
}

/// Whether a summary is due after `batch`'s round committed `reply`: the exchanges
/// after the stored summary (what the round read, and its own) leave no room in the
/// history window for one more exchange, or fill three quarters of its characters.
pub(super) fn due(settings: &SummarySettings, batch: &Batch, reply: &str) -> bool {
    let own = Exchange {
        user: batch
            .pending
            .iter()
            .map(|m| crate::domain::Said::new(&m.author, m.said()))
            .collect(),
        reply: reply.to_owned(),
    };
    let sizes: Vec<usize> = batch
        .history
        .iter()
        .chain(std::iter::once(&own))
        .map(|e| exchange_chars(e, batch.is_group))
        .collect();
    cover::window_full(&sizes, settings.history)
}

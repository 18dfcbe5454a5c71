//! What both backends do alike with summaries: the stored columns, the exchanges a
//! summary may cover grouped from their rows, and the store's verdict on a summary
//! (so the rule "only if it covers more, in the same context" is written once).

use crate::domain::{Exchange, Said, Timestamp};
use crate::store::{CoverableExchange, NewSummary, Summary, SummaryStored};

/// The summary columns, in [`summary`]'s order.
pub(crate) const SUMMARY_COLUMNS: &str =
    "through_reply, through_message, through_at, messages, text, model, created_at";

/// A stored summary from its columns ([`SUMMARY_COLUMNS`]).
pub(crate) fn summary(
    through_reply: i64,
    through_message: i64,
    through_at: i64,
    messages: i64,
    text: String,
    model: String,
    created_at: i64,
) -> Summary {
    Summary {
        through_reply,
        through_message,
        through_at: Timestamp(through_at),
        messages: messages.max(0) as u64,
        text,
        model,
        created_at: Timestamp(created_at),
    }
}

/// One row of the coverable exchanges' query: the reply (id, text) and one message it
/// covered (id, received at, author, text, transcript), ordered by reply then message.
pub(crate) struct CoverableRow {
    pub reply: i64,
    pub reply_text: String,
    pub message: i64,
    pub received_at: i64,
    pub author: String,
    pub text: String,
    pub transcript: Option<String>,
}

/// The rows grouped into exchanges, oldest first.
pub(crate) fn coverable(rows: impl IntoIterator<Item = CoverableRow>) -> Vec<CoverableExchange> {
    let mut exchanges: Vec<CoverableExchange> = Vec::new();
    for row in rows {
        let said = Said {
            author: row.author,
            text: crate::store::said_text(&row.text, row.transcript.as_deref()),
        };
        match exchanges.last_mut() {
            Some(last) if last.reply == row.reply => {
                last.exchange.user.push(said);
                if row.message > last.newest_message {
                    last.newest_message = row.message;
                    last.newest_at = Timestamp(row.received_at);
                }
            }
            _ => exchanges.push(CoverableExchange {
                reply: row.reply,
                newest_message: row.message,
                newest_at: Timestamp(row.received_at),
                exchange: Exchange {
                    user: vec![said],
                    reply: row.reply_text,
                },
            }),
        }
    }
    exchanges
}

/// The verdict on storing `new` when the conversation's context is `context_version`
/// and the stored summary is `stored` (its context version and last reply):
/// `None` means store it. The lease was checked before.
pub(crate) fn verdict(
    new: &NewSummary,
    context_version: i64,
    stored: Option<(i64, i64)>,
) -> Option<SummaryStored> {
    if new.context_version != context_version {
        return Some(SummaryStored::Reset);
    }
    match stored {
        Some((context, through))
            if context == new.context_version && through >= new.through_reply =>
        {
            Some(SummaryStored::Superseded)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ConversationId;

    fn new(context_version: i64, through_reply: i64) -> NewSummary {
        NewSummary {
            conversation: ConversationId(1),
            context_version,
            through_reply,
            through_message: through_reply,
            through_at: Timestamp(0),
            messages: 1,
            text: "s".into(),
            model: "m".into(),
            usage: None,
            picture_newest_message: through_reply,
        }
    }

    #[test]
    fn a_summary_is_stored_only_if_it_covers_more_in_the_same_context() {
        assert_eq!(verdict(&new(0, 5), 0, None), None);
        assert_eq!(verdict(&new(0, 5), 0, Some((0, 4))), None);
        assert_eq!(
            verdict(&new(0, 5), 0, Some((0, 5))),
            Some(SummaryStored::Superseded)
        );
        assert_eq!(
            verdict(&new(0, 5), 0, Some((0, 9))),
            Some(SummaryStored::Superseded)
        );
        // A stored summary of an earlier context is replaced; one made before a `/new`
        // is never stored after it.
        assert_eq!(verdict(&new(7, 8), 7, Some((0, 9))), None);
        assert_eq!(verdict(&new(0, 9), 7, None), Some(SummaryStored::Reset));
    }
}

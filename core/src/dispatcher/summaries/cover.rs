//! When a summary is due, and which exchanges it covers: the window's arithmetic,
//! apart from the store and the model so it can be checked on its own.

use crate::llm::HistoryBudget;

/// Whether the exchanges after the stored summary (each one's characters, oldest
/// first: `llm::exchange_chars`) fill the window: one more exchange would not fit its
/// messages, or they take more than three quarters of its characters. A summary made
/// now has the time of the next exchange to land before anything falls out of the
/// window unsummarised.
pub(super) fn window_full(sizes: &[usize], budget: HistoryBudget) -> bool {
    let chars: usize = sizes.iter().sum();
    (sizes.len() + 1) * 2 > budget.messages || chars * 4 > budget.chars * 3
}

/// How many of the exchanges (their characters, oldest first) the next summary
/// covers: all but the newest that fit half the window (at least the newest one stays
/// verbatim), and no more than fit `input_chars` as the summary's input (at least
/// one, if any is covered).
pub(super) fn covered(sizes: &[usize], budget: HistoryBudget, input_chars: usize) -> usize {
    let half = HistoryBudget {
        messages: budget.messages / 2,
        chars: budget.chars / 2,
    };
    let kept = half.kept(sizes).max(1);
    let candidates = sizes.len().saturating_sub(kept);
    let mut chars = 0;
    let mut n = 0;
    for size in &sizes[..candidates] {
        chars += size;
        if n > 0 && chars > input_chars {
            break;
        }
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Exchange, Said};
    use crate::llm::exchange_chars;

    /// The sizes of `n` exchanges of a `size`-character message and a short reply.
    fn exchanges(n: usize, size: usize) -> Vec<usize> {
        (0..n)
            .map(|i| {
                let exchange = Exchange {
                    user: vec![Said::new("ann", "x".repeat(size))],
                    reply: format!("r{i}"),
                };
                exchange_chars(&exchange, false)
            })
            .collect()
    }

    const SIX: HistoryBudget = HistoryBudget {
        messages: 6,
        chars: 100_000,
    };

    /// With a window of six messages (three exchanges): due at three exchanges, and a
    /// summary covers all but the newest.
    #[test]
    fn a_summary_is_due_when_the_window_is_full_and_keeps_the_newest_half() {
        assert!(!window_full(&exchanges(2, 10), SIX));
        assert!(window_full(&exchanges(3, 10), SIX));
        assert_eq!(covered(&exchanges(3, 10), SIX, 100_000), 2);
        assert_eq!(covered(&exchanges(5, 10), SIX, 100_000), 4);
        assert_eq!(covered(&exchanges(1, 10), SIX, 100_000), 0);
        // The default window (20 messages): due at ten exchanges, five covered.
        let twenty = HistoryBudget {
            messages: 20,
            chars: 16_000,
        };
        assert!(!window_full(&exchanges(9, 10), twenty));
        assert!(window_full(&exchanges(10, 10), twenty));
        assert_eq!(covered(&exchanges(10, 10), twenty, 100_000), 5);
    }

    /// Characters count too: long exchanges fill the window before their number does,
    /// and the summary's input is bounded (one exchange at least).
    #[test]
    fn long_exchanges_fill_the_window_and_bound_the_input() {
        let budget = HistoryBudget {
            messages: 100,
            chars: 1000,
        };
        assert!(!window_full(&exchanges(2, 300), budget));
        assert!(window_full(&exchanges(3, 300), budget));
        // Half the window (500 characters) keeps one exchange of ~302.
        assert_eq!(covered(&exchanges(3, 300), budget, 100_000), 2);
        assert_eq!(covered(&exchanges(3, 300), budget, 400), 1);
        assert_eq!(covered(&exchanges(3, 300), budget, 10), 1);
    }
}

//! Splitting a Markdown reply into parts that fit a platform's length limit.
//!
//! Parts break at a paragraph, else a line, else a word boundary (never inside a
//! character), and a fenced code block cut in two is closed at the end of one part
//! and reopened, with its language, at the start of the next. The result depends only
//! on the input, so an interrupted delivery can resume at a part index.

/// Length of a text in characters (Unicode scalar values).
pub fn char_len(text: &str) -> usize {
    text.chars().count()
}

const FENCE: &str = "```";
const CLOSE: &str = "\n```";

/// Split `text` into parts of at most `max_chars` characters each.
///
/// `max_chars` must leave room for a reopened fence; limits below 32 are raised to 32.
pub fn split_message(text: &str, max_chars: usize) -> Vec<String> {
    let max_chars = max_chars.max(32);
    if char_len(text) <= max_chars {
        return vec![text.to_owned()];
    }
    let mut parts = Vec::new();
    let mut rest = text;
    let mut open_fence: Option<String> = None;
    loop {
        let prefix = open_fence
            .as_ref()
            .map(|f| format!("{f}\n"))
            .unwrap_or_default();
        if char_len(&prefix) + char_len(rest) <= max_chars {
            parts.push(format!("{prefix}{rest}"));
            break;
        }
        // Room for the text, keeping space for a closing fence in case one is needed.
        let budget = max_chars
            .saturating_sub(char_len(&prefix) + CLOSE.len())
            .max(1);
        let window_end = byte_index(rest, budget);
        let cut = best_cut(&rest[..window_end]);
        let (chunk, tail) = rest.split_at(cut);
        let fence_after = fence_state(chunk, open_fence.clone());
        let mut part = format!("{prefix}{}", chunk.trim_end_matches([' ', '\n']));
        if fence_after.is_some() {
            part.push_str(CLOSE);
        }
        parts.push(part);
        rest = skip_separator(tail);
        open_fence = fence_after;
        if rest.is_empty() {
            break;
        }
    }
    parts
}

/// `text` cut to at most `max_chars` characters, note included: at a paragraph, else
/// a line, else a word boundary (where [`split_message`] would end its first part, an
/// open code block closed), then a blank line and `note`. `None` when `text` fits.
pub fn truncate(text: &str, max_chars: usize, note: &str) -> Option<String> {
    if char_len(text) <= max_chars {
        return None;
    }
    let budget = max_chars.saturating_sub(char_len(note) + 2);
    // One character more than the budget: split_message must cut, and reads no further.
    let window = &text[..byte_index(text, budget + 1)];
    let head = split_message(window, budget).swap_remove(0);
    Some(format!("{head}\n\n{note}"))
}

/// Byte index of the `n`th character of `s` (or its end).
pub fn byte_index(s: &str, n: usize) -> usize {
    s.char_indices().nth(n).map_or(s.len(), |(i, _)| i)
}

/// Where to end a part within `window`: the last paragraph break in its second half,
/// else the last line break there, else the last space there; then the same anywhere
/// in the window; else the whole window (a word longer than a part).
pub fn best_cut(window: &str) -> usize {
    let half = window.len() / 2;
    for min in [half, 1] {
        for sep in ["\n\n", "\n", " "] {
            if let Some(i) = window.rfind(sep).filter(|&i| i >= min) {
                return i;
            }
        }
    }
    window.len()
}

/// Drop the separator a cut landed on, so the next part starts with content. Only
/// the line breaks and one space of the boundary go; indentation stays.
fn skip_separator(tail: &str) -> &str {
    let tail = tail.trim_start_matches('\n');
    tail.strip_prefix(' ').unwrap_or(tail)
}

/// The fence still open after `chunk`, given the one open before it: a line starting
/// with ``` toggles; the opening line (with its language) is what reopens it.
fn fence_state(chunk: &str, mut open: Option<String>) -> Option<String> {
    for line in chunk.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with(FENCE) {
            open = match open {
                Some(_) => None,
                None => Some(trimmed.trim_end().to_owned()),
            };
        }
    }
    open
}

#[cfg(test)]
mod tests {
    use super::*;

    fn balanced(part: &str) -> bool {
        part.lines()
            .filter(|l| l.trim_start().starts_with(FENCE))
            .count()
            % 2
            == 0
    }

    #[test]
    fn short_text_is_one_part() {
        assert_eq!(split_message("hello", 100), vec!["hello"]);
    }

    #[test]
    fn parts_fit_and_break_at_paragraphs() {
        let para = "word ".repeat(150).trim_end().to_owned(); // 749 chars
        let text = [para.as_str(); 8].join("\n\n"); // ~6000 chars
        let parts = split_message(&text, 4096);
        assert_eq!(parts.len(), 2);
        for p in &parts {
            assert!(char_len(p) <= 4096);
            assert!(p.ends_with("word") && p.starts_with("word"), "{p:?}");
        }
        assert_eq!(parts.join("\n\n"), text);
    }

    #[test]
    fn a_4500_char_reply_makes_three_discord_messages() {
        let text = "lorem ipsum dolor sit amet ".repeat(167); // 4509 chars
        let parts = split_message(text.trim_end(), 2000);
        assert_eq!(parts.len(), 3);
        assert!(parts.iter().all(|p| char_len(p) <= 2000));
        // Words are never cut.
        assert_eq!(
            parts
                .join(" ")
                .split(' ')
                .filter(|w| *w != "lorem"
                    && *w != "ipsum"
                    && *w != "dolor"
                    && *w != "sit"
                    && *w != "amet")
                .count(),
            0
        );
    }

    #[test]
    fn multibyte_characters_are_never_split() {
        let text = "é".repeat(5000) + &"🦀".repeat(5000);
        let parts = split_message(&text, 4096);
        assert!(parts.iter().all(|p| char_len(p) <= 4096));
        assert_eq!(parts.concat(), text);
    }

    #[test]
    fn code_blocks_are_closed_and_reopened() {
        let code: String = (0..300).map(|i| format!("let x{i} = {i};\n")).collect();
        let text = format!("Here you go:\n\n```rust\n{code}```\n\nDone.");
        let parts = split_message(&text, 2000);
        assert!(parts.len() >= 3, "{}", parts.len());
        for (i, p) in parts.iter().enumerate() {
            assert!(char_len(p) <= 2000, "part {i} too long");
            assert!(balanced(p), "part {i} leaves a fence open:\n{p}");
        }
        assert!(parts[1].starts_with("```rust\n"));
        assert!(parts.last().unwrap().ends_with("Done."));
    }

    #[test]
    fn a_word_longer_than_a_part_is_cut_hard() {
        let text = "x".repeat(100);
        let parts = split_message(&text, 40);
        assert!(parts.iter().all(|p| char_len(p) <= 40));
        assert_eq!(parts.concat(), text);
    }

    #[test]
    fn a_long_reply_is_cut_at_a_paragraph_with_the_note_inside_the_limit() {
        let para = "word ".repeat(100).trim_end().to_owned(); // 499 chars
        let text = [para.as_str(); 400].join("\n\n"); // ~200,000 chars
        let note = "[… reply cut at 2000 characters]";
        let cut = truncate(&text, 2000, note).unwrap();
        assert!(char_len(&cut) <= 2000, "{}", char_len(&cut));
        assert!(char_len(&cut) > 1400, "{}", char_len(&cut));
        assert!(cut.ends_with(&format!("word\n\n{note}")), "{cut}");
        assert_eq!(truncate("short", 2000, note), None);
        // Inside a code block: the block is closed before the note.
        let code: String = (0..500).map(|i| format!("let x{i} = {i};\n")).collect();
        let cut = truncate(&format!("```rust\n{code}```"), 1000, note).unwrap();
        assert!(char_len(&cut) <= 1000);
        assert!(cut.ends_with(&format!("\n```\n\n{note}")), "{cut}");
    }

    #[test]
    fn splitting_is_deterministic() {
        let text = "alpha beta\n\ngamma ".repeat(500);
        assert_eq!(split_message(&text, 2000), split_message(&text, 2000));
    }
}

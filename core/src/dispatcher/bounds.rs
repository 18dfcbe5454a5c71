//! How long a reply may be: one cut for the reply a round commits and for the live
//! draft that shows it while it is written, so a draft never shows what the reply
//! will not say (its own module: rounds and drafts both use it, neither owns it).

use crate::texts;

/// `text` cut to at most `max` characters (at a paragraph, line or word), with a note
/// saying so; `None` when it fits. Replies and their drafts are cut alike.
pub(super) fn cut(text: &str, max: usize) -> Option<String> {
    lull_port::split::truncate(text, max, &texts::reply_cut_note(max))
}

//! Escaping text into the console's HTML: every id and text shown comes from platforms
//! and users, so every one passes through [`esc`].

/// `text` with HTML's special characters escaped (ids come from platforms and users).
pub(super) fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

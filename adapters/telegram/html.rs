//! The model's Markdown as Telegram HTML.
//!
//! Telegram's HTML parse mode knows a handful of tags (`b`, `i`, `s`, `u`, `code`,
//! `pre`, `a`, `blockquote`) and three entities that must be escaped (`&lt;`, `&gt;`,
//! `&amp;`); anything else makes it refuse the whole message with "can't parse
//! entities". So every piece of text is escaped, every tag is emitted as an
//! open/close pair by construction, and Markdown this converter does not understand
//! stays as literal text. Markers never span lines: a stray `*` or `_` (as in
//! `2 * 3` or `snake_case`) stays what it is.

/// Convert one part of a reply (already split to Telegram's length) to HTML.
///
/// Blocks: fenced code (` ```lang `) becomes `<pre><code class="language-lang">`,
/// `#` headings bold, `>` quotes `<blockquote>`, `-`/`*`/`+` list items `•`.
/// Inline: `**bold**`/`__bold__`, `*italic*`/`_italic_`, `~~strike~~`, `` `code` ``,
/// `[text](url)` links (http, https, tg and mailto only), `\` escapes.
pub(super) fn markdown_to_html(markdown: &str) -> String {
    let lines: Vec<&str> = markdown.split('\n').collect();
    let mut out: Vec<String> = Vec::with_capacity(lines.len());
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start();
        if let Some(info) = trimmed.strip_prefix("```") {
            let language = info.split_whitespace().next().unwrap_or("");
            let mut code = Vec::new();
            i += 1;
            while i < lines.len() && !lines[i].trim_start().starts_with("```") {
                code.push(lines[i]);
                i += 1;
            }
            // Past the closing fence (an unclosed block runs to the end).
            i += 1;
            let body = escape(&code.join("\n"));
            out.push(if language.is_empty() {
                format!("<pre>{body}</pre>")
            } else {
                format!(
                    "<pre><code class=\"language-{}\">{body}</code></pre>",
                    escape_attr(language)
                )
            });
            continue;
        }
        if trimmed.starts_with('>') {
            let mut quote = Vec::new();
            while i < lines.len() && lines[i].trim_start().starts_with('>') {
                let text = lines[i].trim_start()[1..]
                    .strip_prefix(' ')
                    .unwrap_or(&lines[i].trim_start()[1..]);
                quote.push(inline(text));
                i += 1;
            }
            out.push(format!("<blockquote>{}</blockquote>", quote.join("\n")));
            continue;
        }
        out.push(block_line(line));
        i += 1;
    }
    out.join("\n")
}

/// One line outside code blocks and quotes: a heading, a list item or text.
fn block_line(line: &str) -> String {
    let trimmed = line.trim_start();
    let hashes = trimmed.chars().take_while(|&c| c == '#').count();
    if (1..=6).contains(&hashes) && trimmed[hashes..].starts_with(' ') {
        return format!("<b>{}</b>", inline(trimmed[hashes..].trim()));
    }
    let indent = &line[..line.len() - trimmed.len()];
    for bullet in ["- ", "* ", "+ "] {
        if let Some(rest) = trimmed.strip_prefix(bullet) {
            return format!("{indent}• {}", inline(rest));
        }
    }
    inline(line)
}

/// Escape text for Telegram HTML.
pub(super) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            c => out.push(c),
        }
    }
    out
}

/// Escape an attribute value (quoted with `"`).
fn escape_attr(text: &str) -> String {
    escape(text).replace('"', "&quot;")
}

/// Inline Markdown of one line as HTML.
fn inline(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 16);
    let mut i = 0;
    while i < s.len() {
        let rest = &s[i..];
        let c = rest.chars().next().expect("non-empty");
        if c == '\\'
            && let Some(next) = rest[1..].chars().next().filter(char::is_ascii_punctuation)
        {
            out.push_str(&escape(&next.to_string()));
            i += 1 + next.len_utf8();
            continue;
        }
        if c == '`' {
            let run = backtick_run(rest);
            if let Some(end) = find_backtick_run(&rest[run..], run) {
                let code = &rest[run..run + end];
                out.push_str("<code>");
                out.push_str(&escape(code));
                out.push_str("</code>");
                i += run + end + run;
                continue;
            }
            // No closing run: the whole run is literal.
            out.push_str(&rest[..run]);
            i += run;
            continue;
        }
        if c == '['
            && let Some((text, url, len)) = link(rest)
        {
            out.push_str(&format!(
                "<a href=\"{}\">{}</a>",
                escape_attr(url),
                inline(text)
            ));
            i += len;
            continue;
        }
        if let Some((delim, tag)) = delimiter_at(s, i)
            && let Some(close) = find_closing(s, i, delim)
        {
            let inner = &s[i + delim.len()..close];
            out.push_str(&format!("<{tag}>{}</{tag}>", inline(inner)));
            i = close + delim.len();
            continue;
        }
        out.push_str(&escape(&c.to_string()));
        i += c.len_utf8();
    }
    out
}

fn backtick_run(s: &str) -> usize {
    s.bytes().take_while(|&b| b == b'`').count()
}

/// Where a run of exactly `n` backticks starts in `s`.
fn find_backtick_run(s: &str, n: usize) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'`' {
            let run = backtick_run(&s[i..]);
            if run == n && i > 0 {
                return Some(i);
            }
            i += run;
        } else {
            i += 1;
        }
    }
    None
}

/// `[text](url)` at the start of `s`: the text, the URL and the length consumed.
fn link(s: &str) -> Option<(&str, &str, usize)> {
    let close = s.find("](")?;
    let text = &s[1..close];
    if text.is_empty() || text.contains('[') {
        return None;
    }
    let url_start = close + 2;
    let url_len = s[url_start..].find(')')?;
    let url = s[url_start..url_start + url_len].trim();
    let allowed = ["http://", "https://", "tg://", "mailto:"];
    if url.is_empty()
        || url.contains(char::is_whitespace)
        || !allowed
            .iter()
            .any(|p| url.to_ascii_lowercase().starts_with(p))
    {
        return None;
    }
    Some((text, url, url_start + url_len + 1))
}

fn is_word(c: Option<char>) -> bool {
    c.is_some_and(char::is_alphanumeric)
}

fn char_before(s: &str, i: usize) -> Option<char> {
    s[..i].chars().next_back()
}

fn char_at(s: &str, i: usize) -> Option<char> {
    s.get(i..).and_then(|r| r.chars().next())
}

/// An opening emphasis delimiter at byte `i` of `s`, and the tag it stands for. It
/// must be followed by a non-space; `_` must not stand inside a word.
fn delimiter_at(s: &str, i: usize) -> Option<(&'static str, &'static str)> {
    let rest = &s[i..];
    let (delim, tag) = [
        ("**", "b"),
        ("__", "b"),
        ("~~", "s"),
        ("*", "i"),
        ("_", "i"),
    ]
    .into_iter()
    .find(|(d, _)| rest.starts_with(d))?;
    let after = char_at(s, i + delim.len());
    if after.is_none_or(char::is_whitespace) {
        return None;
    }
    if delim.starts_with('_') && is_word(char_before(s, i)) {
        return None;
    }
    Some((delim, tag))
}

/// The byte index of the delimiter closing the one opened at `open`, on the same
/// line: preceded by a non-space, not inside a code span; `_` not inside a word; a
/// single `*`/`_` not part of a double one.
fn find_closing(s: &str, open: usize, delim: &str) -> Option<usize> {
    let first = delim.as_bytes()[0];
    let bytes = s.as_bytes();
    let mut k = open + delim.len();
    // The inner text must not be empty.
    let min = k + 1;
    while k < bytes.len() {
        match bytes[k] {
            b'\\' => k += 2,
            b'`' => {
                let run = backtick_run(&s[k..]);
                match find_backtick_run(&s[k + run..], run) {
                    Some(end) => k += run + end + run,
                    None => k += run,
                }
            }
            b if b == first => {
                let run = s[k..].bytes().take_while(|&x| x == first).count();
                let candidates: Vec<usize> = if delim.len() == 1 {
                    // A single delimiter closes only on a run of one (or the last of
                    // a run of three: `***bold italic***`).
                    if run == 1 || run == 3 {
                        vec![k + run - 1]
                    } else {
                        vec![]
                    }
                } else if run >= 2 {
                    // The last two of the run, so `***x***` nests as <b><i>x</i></b>.
                    vec![k + run - 2]
                } else {
                    vec![]
                };
                for c in candidates {
                    let before = char_before(s, c);
                    let after = char_at(s, c + delim.len());
                    let word_after = first == b'_' && is_word(after);
                    if c >= min && before.is_some_and(|b| !b.is_whitespace()) && !word_after {
                        return Some(c);
                    }
                }
                k += run;
            }
            _ => k += 1,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Telegram's rules for HTML: only known tags, properly nested, `&` only as an
    /// entity, no bare `<` or `>`.
    fn well_formed(html: &str) -> bool {
        let mut stack: Vec<String> = Vec::new();
        let mut rest = html;
        while let Some(c) = rest.chars().next() {
            match c {
                '<' => {
                    let Some(end) = rest.find('>') else {
                        return false;
                    };
                    let tag = &rest[1..end];
                    if let Some(name) = tag.strip_prefix('/') {
                        if stack.pop().as_deref() != Some(name) {
                            return false;
                        }
                    } else {
                        let name = tag.split(' ').next().unwrap_or("");
                        if !["b", "i", "s", "u", "code", "pre", "a", "blockquote"].contains(&name) {
                            return false;
                        }
                        stack.push(name.to_owned());
                    }
                    rest = &rest[end + 1..];
                }
                '>' => return false,
                '&' => {
                    let ok = ["&lt;", "&gt;", "&amp;", "&quot;"]
                        .iter()
                        .any(|e| rest.starts_with(e));
                    if !ok {
                        return false;
                    }
                    rest = &rest[1..];
                }
                c => rest = &rest[c.len_utf8()..],
            }
        }
        stack.is_empty()
    }

    fn html(md: &str) -> String {
        let h = markdown_to_html(md);
        assert!(well_formed(&h), "{md:?} → {h:?}");
        h
    }

    #[test]
    fn inline_formatting() {
        assert_eq!(
            html("**bold** and *it* and _it_ and __b__"),
            "<b>bold</b> and <i>it</i> and <i>it</i> and <b>b</b>"
        );
        assert_eq!(
            html("~~gone~~ `x < y && z`"),
            "<s>gone</s> <code>x &lt; y &amp;&amp; z</code>"
        );
        assert_eq!(html("***both***"), "<b><i>both</i></b>");
        assert_eq!(
            html("**bold with `code` inside**"),
            "<b>bold with <code>code</code> inside</b>"
        );
        assert_eq!(html("*a **b** c*"), "<i>a <b>b</b> c</i>");
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(html("a < b > c & d"), "a &lt; b &gt; c &amp; d");
        assert_eq!(html("<b>not a tag</b>"), "&lt;b&gt;not a tag&lt;/b&gt;");
        assert_eq!(html("&amp; stays literal"), "&amp;amp; stays literal");
        assert_eq!(html(r"\*not italic\*"), "*not italic*");
    }

    #[test]
    fn stray_markers_stay_literal() {
        assert_eq!(html("2 * 3 * 4"), "2 * 3 * 4");
        assert_eq!(
            html("snake_case_name and __init__"),
            "snake_case_name and <b>init</b>"
        );
        assert_eq!(html("file_name.rs"), "file_name.rs");
        assert_eq!(html("**unclosed bold"), "**unclosed bold");
        assert_eq!(html("`unclosed code"), "`unclosed code");
        assert_eq!(html("**"), "**");
        assert_eq!(html("a ** b"), "a ** b");
    }

    #[test]
    fn links() {
        assert_eq!(
            html("see [the docs](https://example.com/a?b=1&c=\"2\")"),
            "see <a href=\"https://example.com/a?b=1&amp;c=&quot;2&quot;\">the docs</a>"
        );
        assert_eq!(
            html("[**bold** link](http://x.y)"),
            "<a href=\"http://x.y\"><b>bold</b> link</a>"
        );
        // Only web and Telegram links; anything else stays text.
        assert_eq!(html("[x](javascript:alert(1))"), "[x](javascript:alert(1))");
        assert_eq!(html("[x](not a url)"), "[x](not a url)");
    }

    #[test]
    fn code_blocks_keep_their_language_and_content() {
        let md =
            "Here:\n```rust\nfn main() { if a < b && c > d { println!(\"*hi*\"); } }\n```\nDone.";
        assert_eq!(
            html(md),
            "Here:\n<pre><code class=\"language-rust\">fn main() { if a &lt; b &amp;&amp; c &gt; d { println!(\"*hi*\"); } }</code></pre>\nDone."
        );
        assert_eq!(html("```\nplain\n```"), "<pre>plain</pre>");
        // An unclosed block runs to the end.
        assert_eq!(
            html("```py\nx = 1"),
            "<pre><code class=\"language-py\">x = 1</code></pre>"
        );
    }

    #[test]
    fn headings_lists_and_quotes() {
        assert_eq!(html("# Title *x*"), "<b>Title <i>x</i></b>");
        assert_eq!(html("- one\n  * two\n+ three"), "• one\n  • two\n• three");
        assert_eq!(
            html("> quoted **b**\n> more\nafter"),
            "<blockquote>quoted <b>b</b>\nmore</blockquote>\nafter"
        );
        assert_eq!(html("#hashtag"), "#hashtag");
    }

    #[test]
    fn any_input_gives_well_formed_html() {
        let pieces = [
            "*",
            "**",
            "_",
            "__",
            "~~",
            "`",
            "```",
            "[",
            "](",
            ")",
            "http://a.b",
            "<",
            ">",
            "&",
            " ",
            "\n",
            "a",
            "é",
            "🦀",
            "\\",
            "#",
            "> ",
            "- ",
            "x_y",
        ];
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..5000 {
            let n = rng.usize(1..30);
            let md: String = (0..n).map(|_| pieces[rng.usize(..pieces.len())]).collect();
            html(&md);
        }
    }
}

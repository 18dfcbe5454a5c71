//! The status page's HTML: one document with inline CSS and inline SVG, no script and
//! no external resource, so it renders offline. Every number sits in an element with a
//! stable `id` or `data-` attribute, which scripts (and the browser test) read.

use std::fmt::Write as _;

use super::Snapshot;
pub(super) use super::escape::esc;
use lull_core::money::Usd;
use lull_core::store::{DayTokens, Recent};

const STYLE: &str = "
*{box-sizing:border-box}
body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2430}
header{background:#1d2430;color:#fff;padding:12px 24px}
header h1{font-size:20px;margin:0}header p{margin:4px 0 0;color:#b8c0cc}
main{padding:16px 24px;display:grid;grid-template-columns:repeat(auto-fill,minmax(min(380px,100%),1fr));gap:16px}
section{min-width:0;overflow-x:auto;background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:12px 16px}
section.wide{grid-column:1/-1}
@media (max-width:600px){main{padding:8px}header{padding:8px 12px}}
h2{font-size:15px;margin:0 0 8px}
table{border-collapse:collapse;width:100%}
td,th{text-align:left;padding:3px 6px;border-bottom:1px solid #eef0f3;vertical-align:top}
code{overflow-wrap:anywhere}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.big{font-size:26px;font-weight:600}
.tiles{display:flex;gap:16px;flex-wrap:wrap}.tile{min-width:80px}.tile small{display:block;color:#5b6675}
.ok{color:#1a7f37}.bad{color:#c0262d}.muted{color:#5b6675}
svg text{font:11px system-ui,sans-serif;fill:#5b6675}
form{display:flex;gap:8px;margin-top:12px;flex-wrap:wrap}input,select,textarea,button{padding:6px;font:inherit}
nav{display:flex;flex-wrap:wrap;gap:4px 16px}nav a{color:#b8c0cc}nav a.here{color:#fff;font-weight:600}
textarea{width:100%;min-height:5em}.done{color:#1a7f37}
.answers{display:flex;gap:8px}.answers form{margin-top:0}
";

/// The console's pages, linked from every header: path, label.
const PAGES: [(&str, &str); 7] = [
    ("/", "Overview"),
    ("/chats", "Chats"),
    ("/people", "People"),
    ("/jobs", "Jobs"),
    ("/memories", "Memories"),
    ("/approvals", "Approvals"),
    ("/tools", "Tools"),
];

/// The console's navigation, `here` marked.
pub(super) fn nav(here: &str) -> String {
    let links: Vec<String> = PAGES
        .iter()
        .map(|(path, label)| {
            let class = if *path == here { " class=\"here\"" } else { "" };
            format!("<a href=\"{path}\"{class}>{label}</a>")
        })
        .collect();
    format!(
        "<nav>{}<a href=\"/logout\"{}>Log out</a></nav>",
        links.join(""),
        if here == "/logout" {
            " class=\"here\""
        } else {
            ""
        }
    )
}

pub(super) fn document(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
         <title>{}</title><style>{STYLE}</style></head><body>{body}</body></html>\n",
        esc(title)
    )
}

/// The login form (`POST /login`), with `error` above it after a wrong token.
pub(super) fn login(error: Option<&str>) -> String {
    let error = error
        .map(|e| format!("<p class=\"bad\" id=\"login-error\">{}</p>", esc(e)))
        .unwrap_or_default();
    document(
        "lull — log in",
        &format!(
            "<header><h1>lull status</h1></header><main><section>\
             <h2>Log in</h2><p>Enter the token set in <code>LULL_HTTP_TOKEN</code>.</p>{error}\
             <form method=\"post\" action=\"/login\" id=\"login\">\
             <input type=\"password\" name=\"token\" autocomplete=\"current-password\" required>\
             <button type=\"submit\">Log in</button></form></section></main>"
        ),
    )
}

fn tile(out: &mut String, id: &str, value: u64, label: &str) {
    let _ = write!(
        out,
        "<div class=\"tile\"><span class=\"big\" id=\"{id}\" data-value=\"{value}\">{value}</span><small>{}</small></div>",
        esc(label)
    );
}

fn recent_row(out: &mut String, id: &str, label: &str, recent: Recent) {
    let _ = write!(
        out,
        "<tr><th>{}</th><td class=\"n\" id=\"{id}-hour\" data-value=\"{h}\">{h}</td>\
         <td class=\"n\" id=\"{id}-day\" data-value=\"{d}\">{d}</td></tr>",
        esc(label),
        h = recent.hour,
        d = recent.day
    );
}

/// The whole page for `s`.
pub(super) fn render(s: &Snapshot) -> String {
    let st = &s.store;
    let mut out = String::new();
    let generated = jiff::Timestamp::from_millisecond(s.generated_at)
        .map(|t| t.strftime("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_default();
    let db_class = if s.database == "ok" { "ok" } else { "bad" };
    let _ = write!(
        out,
        "<header><h1>lull status</h1><p>Read at <span id=\"generated-at\" data-value=\"{}\">{}</span> \
         · database: <span id=\"database\" class=\"{db_class}\">{}</span> · refresh the page for new numbers (kept {} s)</p>{}</header><main>",
        s.generated_at,
        esc(&generated),
        esc(&s.database),
        super::CACHE_TTL.as_secs(),
        nav("/")
    );

    super::running::section(&mut out, s);
    super::alerts::section(&mut out, s);
    out.push_str("<section><h2>Conversations</h2><div class=\"tiles\">");
    tile(
        &mut out,
        "pending",
        st.pending,
        "pending (waiting for a reply)",
    );
    tile(
        &mut out,
        "answering",
        st.answering,
        "being answered (lease held)",
    );
    tile(
        &mut out,
        "held",
        st.held,
        "waiting on a limit (rate or budget)",
    );
    tile(
        &mut out,
        "retrying",
        st.retrying,
        "waiting to retry the model",
    );
    out.push_str("</div></section>");
    out.push_str("<section><h2>Memory</h2><div class=\"tiles\">");
    tile(
        &mut out,
        "memories-person",
        s.memories.person,
        "memories about people (private chats)",
    );
    tile(
        &mut out,
        "memories-chat",
        s.memories.chat,
        "memories of group chats",
    );
    out.push_str("</div></section>");

    out.push_str(
        "<section><h2>Replies and the model</h2><table id=\"recent\">\
         <tr><th></th><th>last hour</th><th>last 24 h</th></tr>",
    );
    recent_row(&mut out, "sent", "replies sent", st.sent);
    recent_row(&mut out, "failed", "replies failed (given up)", st.failed);
    recent_row(&mut out, "generated", "model replies", st.generated);
    recent_row(
        &mut out,
        "model-failures",
        "model failures told to users",
        st.model_failures,
    );
    out.push_str(
        "</table><p class=\"muted\">This process since it started:</p><table id=\"process\">",
    );
    let _ = write!(
        out,
        "<tr><th>replies dropped as stale</th><td class=\"n\" id=\"stale-process\" data-value=\"{n}\">{n}</td></tr>",
        n = s.process.replies_dropped_stale
    );
    for (outcome, n) in &s.process.llm_requests {
        let _ = write!(
            out,
            "<tr><th>model requests: {o}</th><td class=\"n\" id=\"llm-{o}-process\" data-outcome=\"{o}\" data-value=\"{n}\">{n}</td></tr>",
            o = esc(outcome)
        );
    }
    out.push_str("</table></section>");

    out.push_str("<section><h2>Processes (replicas holding a lease)</h2>");
    if st.holders.is_empty() {
        out.push_str("<p class=\"muted\" id=\"processes\" data-count=\"0\">Running and idle: no process is answering a conversation or holding a platform connection right now (one takes a lease when a message needs an answer).</p>");
    } else {
        let _ = write!(
            out,
            "<table id=\"processes\" data-count=\"{}\"><tr><th>holder</th><th>conversations</th><th>connections</th></tr>",
            st.holders.len()
        );
        for h in &st.holders {
            let me = s.process.holder.as_deref() == Some(h.holder.as_str());
            let _ = write!(
                out,
                "<tr data-holder=\"{id}\" data-conversations=\"{c}\" data-connections=\"{conns}\"><td><code>{id}</code>{me}</td>\
                 <td class=\"n\">{c}</td><td>{conns}</td></tr>",
                id = esc(&h.holder),
                c = h.conversations,
                conns = esc(&h.connections.join(", ")),
                me = if me { " (this process)" } else { "" }
            );
        }
        out.push_str("</table>");
    }
    if let Some(me) = &s.process.holder {
        let _ = write!(
            out,
            "<p class=\"muted\">This process: <code id=\"this-process\">{}</code></p>",
            esc(me)
        );
    }
    out.push_str("</section>");

    out.push_str("<section><h2>Platforms</h2><table id=\"platforms\">");
    for (platform, state) in &s.platforms {
        let class = if state == "up" || state == "standby" {
            "ok"
        } else {
            "bad"
        };
        let holder = st
            .connections
            .iter()
            .filter(|c| super::polls(&c.resource, platform))
            .map(|c| format!("{} → {}", c.resource, c.holder))
            .collect::<Vec<_>>()
            .join("<br>");
        let _ = write!(
            out,
            "<tr data-platform=\"{p}\" data-state=\"{s}\"><th>{p}</th><td class=\"{class}\">{s}</td><td>{h}</td></tr>",
            p = esc(platform),
            s = esc(state),
            h = esc(&holder).replace("&lt;br&gt;", "<br>")
        );
    }
    out.push_str("</table>");
    if !s.mcp_servers.is_empty() {
        out.push_str("<h2>MCP servers</h2><table id=\"mcp-servers\">");
        for server in &s.mcp_servers {
            let _ = write!(
                out,
                "<tr data-server=\"{n}\" data-state=\"{s}\"><th>{n}</th><td class=\"{class}\">{s}</td><td class=\"n\">{t} tools</td><td>{e}</td></tr>",
                n = esc(&server.name),
                s = server.state,
                class = if server.state == "ready" { "ok" } else { "bad" },
                t = server.tools,
                e = esc(server.error.as_deref().unwrap_or(""))
            );
        }
        out.push_str("</table>");
    }
    out.push_str("</section>");

    let tokens_today = st.tokens_per_day.last().map_or(0, |d| d.tokens);
    let _ = write!(
        out,
        "<section class=\"wide\"><h2>Tokens per day (last 30 days, LULL_TIMEZONE's days; as /usage counts them) — today \
         <span id=\"tokens-today\" data-value=\"{tokens_today}\">{tokens_today}</span></h2>{}</section>",
        bar_chart(&st.tokens_per_day)
    );
    dollars_section(&mut out, s);
    let _ = write!(
        out,
        "<section class=\"wide\"><h2>Replies sent per hour (last 24 hours) — in all \
         <span id=\"replies-24h\" data-value=\"{n}\">{n}</span></h2>{}</section>",
        line_chart(&st.replies_per_hour),
        n = st.sent.day
    );

    out.push_str("<section class=\"wide\"><h2>Top conversations by tokens today</h2>");
    if st.top_conversations.is_empty() {
        out.push_str("<p class=\"muted\" id=\"top-conversations\" data-count=\"0\">No tokens spent today.</p>");
    } else {
        let _ = write!(
            out,
            "<table id=\"top-conversations\" data-count=\"{}\"><tr><th>conversation</th><th>platform</th><th>chat id</th><th>replies</th><th>tokens</th></tr>",
            st.top_conversations.len()
        );
        for c in &st.top_conversations {
            let _ = write!(
                out,
                "<tr data-conversation=\"{id}\" data-key=\"{k}\" data-tokens=\"{t}\" data-replies=\"{r}\"><td>#{id}</td><td>{p}</td><td><code>{k}</code></td>\
                 <td class=\"n\">{r}</td><td class=\"n\">{t}</td></tr>",
                id = c.conversation,
                p = esc(&c.platform),
                k = esc(&c.key),
                r = c.replies,
                t = c.tokens
            );
        }
        out.push_str("</table>");
    }
    out.push_str("</section></main>");
    document("lull status", &out)
}

const CHART_W: f64 = 1160.0;
const CHART_H: f64 = 180.0;
const PAD_L: f64 = 56.0;
const PAD_B: f64 = 22.0;

/// The y axis of a chart whose largest value is `max`, labelled `top` and `zero`:
/// the scale from values to heights.
fn y_axis(out: &mut String, max: u64, top: &str, zero: &str) -> f64 {
    let plot_h = CHART_H - PAD_B - 8.0;
    let _ = write!(
        out,
        "<line x1=\"{PAD_L}\" y1=\"8\" x2=\"{PAD_L}\" y2=\"{b}\" stroke=\"#c5cbd3\"/>\
         <line x1=\"{PAD_L}\" y1=\"{b}\" x2=\"{CHART_W}\" y2=\"{b}\" stroke=\"#c5cbd3\"/>\
         <text x=\"{tx}\" y=\"16\" text-anchor=\"end\">{top}</text>\
         <text x=\"{tx}\" y=\"{b}\" text-anchor=\"end\">{zero}</text>",
        b = CHART_H - PAD_B,
        tx = PAD_L - 6.0
    );
    plot_h / max.max(1) as f64
}

/// A bar per day of `days` (an `<svg id>` of its own, `label` for screen readers):
/// each bar `value` high, scaled to the largest, drawn as `bar` says (its class,
/// `data-` attributes and title); the y axis labelled `top` and `zero`; a date every
/// week.
fn day_bars(
    (id, label): (&str, &str),
    days: &[DayTokens],
    value: impl Fn(&DayTokens) -> u64,
    (top, zero): (&str, &str),
    bar: impl Fn(&DayTokens) -> String,
) -> String {
    let mut out = format!(
        "<svg id=\"{id}\" role=\"img\" aria-label=\"{label}\" viewBox=\"0 0 {CHART_W} {CHART_H}\" width=\"100%\">"
    );
    let scale = y_axis(
        &mut out,
        days.iter().map(&value).max().unwrap_or(0),
        top,
        zero,
    );
    let slot = (CHART_W - PAD_L) / days.len().max(1) as f64;
    let base = CHART_H - PAD_B;
    for (i, day) in days.iter().enumerate() {
        let h = value(day) as f64 * scale;
        let x = PAD_L + i as f64 * slot + slot * 0.15;
        let _ = write!(
            out,
            "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{h:.1}\" {}",
            bar(day),
            y = base - h,
            w = slot * 0.7
        );
        if (days.len() - 1 - i).is_multiple_of(7) {
            let _ = write!(
                out,
                "<text x=\"{cx:.1}\" y=\"{ty}\" text-anchor=\"middle\">{}</text>",
                esc(day.day.get(5..).unwrap_or(&day.day)),
                cx = x + slot * 0.35,
                ty = CHART_H - 6.0
            );
        }
    }
    out.push_str("</svg>");
    out
}

/// Tokens per day as bars, one per day, each with `data-day` and `data-tokens`.
fn bar_chart(days: &[DayTokens]) -> String {
    let max = days.iter().map(|d| d.tokens).max().unwrap_or(0).to_string();
    day_bars(
        ("tokens-per-day", "tokens per day"),
        days,
        |d| d.tokens,
        (&max, "0"),
        |d| {
            format!(
                "class=\"bar\" data-day=\"{d}\" data-tokens=\"{t}\" fill=\"#3b6fd4\"><title>{d}: {t} tokens</title></rect>",
                d = esc(&d.day),
                t = d.tokens
            )
        },
    )
}

/// The dollars section: today's and the month's so far (against `LULL_MONTHLY_USD`
/// when set), and dollars per day as bars.
fn dollars_section(out: &mut String, s: &Snapshot) {
    let st = &s.store;
    let today = st.tokens_per_day.last().map_or(Usd::ZERO, |d| d.cost);
    let budget = if s.monthly_budget.is_set() {
        format!(
            " of <span id=\"month-budget\" data-value=\"{}\">{}</span>",
            s.monthly_budget.dollars(),
            s.monthly_budget
        )
    } else {
        String::new()
    };
    let _ = write!(
        out,
        "<section class=\"wide\"><h2>Dollars per day (last 30 days, at LULL_PRICES) — today \
         <span id=\"cost-today\" data-value=\"{}\">{}</span>; this month so far \
         <span id=\"cost-month\" data-value=\"{}\">{}</span>{budget}</h2>{}</section>",
        today.dollars(),
        today,
        st.month_cost.dollars(),
        st.month_cost,
        cost_chart(&st.tokens_per_day)
    );
}

/// Dollars per day as bars, one per day, each with `data-day` and `data-cost`
/// (dollars).
fn cost_chart(days: &[DayTokens]) -> String {
    let max = days
        .iter()
        .map(|d| d.cost)
        .max()
        .unwrap_or(Usd::ZERO)
        .to_string();
    day_bars(
        ("cost-per-day", "dollars per day"),
        days,
        |d| d.cost.0,
        (&max, "$0"),
        |d| {
            format!(
                "class=\"cost-bar\" data-day=\"{d}\" data-cost=\"{c}\" fill=\"#1a7f37\"><title>{d}: {shown}</title></rect>",
                d = esc(&d.day),
                c = d.cost.dollars(),
                shown = d.cost
            )
        },
    )
}

/// Replies per hour as a line, the last point the hour ending now; each point a circle
/// with `data-hour` (hours ago: 23 … 0) and `data-replies`.
fn line_chart(hours: &[u64]) -> String {
    let mut out = format!(
        "<svg id=\"replies-per-hour\" role=\"img\" aria-label=\"replies per hour\" viewBox=\"0 0 {CHART_W} {CHART_H}\" width=\"100%\">"
    );
    let max = hours.iter().copied().max().unwrap_or(0);
    let scale = y_axis(&mut out, max, &max.to_string(), "0");
    let step = (CHART_W - PAD_L - 12.0) / (hours.len().max(2) - 1) as f64;
    let base = CHART_H - PAD_B;
    let point = |i: usize, n: u64| (PAD_L + 6.0 + i as f64 * step, base - n as f64 * scale);
    let line: Vec<String> = hours
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let (x, y) = point(i, n);
            format!("{x:.1},{y:.1}")
        })
        .collect();
    let _ = write!(
        out,
        "<polyline points=\"{}\" fill=\"none\" stroke=\"#1a7f37\" stroke-width=\"2\"/>",
        line.join(" ")
    );
    for (i, &n) in hours.iter().enumerate() {
        let (x, y) = point(i, n);
        let ago = hours.len() - 1 - i;
        let _ = write!(
            out,
            "<circle class=\"point\" data-hour=\"{ago}\" data-replies=\"{n}\" cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"3\" fill=\"#1a7f37\"><title>{ago} h ago: {n}</title></circle>"
        );
        if ago.is_multiple_of(6) {
            let label = if ago == 0 {
                "now".to_owned()
            } else {
                format!("-{ago} h")
            };
            let _ = write!(
                out,
                "<text x=\"{x:.1}\" y=\"{ty}\" text-anchor=\"{anchor}\">{label}</text>",
                ty = CHART_H - 6.0,
                anchor = if ago == 0 { "end" } else { "middle" }
            );
        }
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_escaped_and_nothing_is_fetched() {
        let mut snapshot = super::super::Snapshot {
            monthly_budget: Usd(10_000_000_000),
            ..super::super::Snapshot::idle()
        };
        snapshot
            .store
            .top_conversations
            .push(lull_core::store::ConversationTokens {
                conversation: 1,
                platform: "http".into(),
                key: "<script>x</script>".into(),
                tokens: 5,
                replies: 1,
            });
        snapshot.store.month_cost = Usd(2_500_000_000);
        let page = render(&snapshot);
        assert!(!page.contains("<script"), "{page}");
        assert!(
            page.contains("this month so far <span id=\"cost-month\" data-value=\"2.5\">$2.50</span> of <span id=\"month-budget\" data-value=\"10\">$10.00</span>"),
            "{page}"
        );
        assert!(page.contains("&lt;script&gt;"));
        for external in ["http://", "https://", "src=", "@import"] {
            assert!(!page.contains(external), "{external} in the page");
        }
    }
}

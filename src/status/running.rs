//! The overview's first section, what runs: lull's version, the model chats answer
//! with and the models `/model` offers, the approvals waiting for a yes, and today's
//! replies, tokens and dollars at a glance. The model and approvals are known only
//! where the console has a dispatcher (in `lull run`).

use std::fmt::Write as _;

use serde::Serialize;

use super::Snapshot;
use super::escape::esc;

/// What runs, as the overview shows it.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Running {
    /// lull's version (`CARGO_PKG_VERSION`).
    pub version: &'static str,
    /// The model a chat that chose none answers with (`None`: no dispatcher here).
    pub model: Option<String>,
    /// The models `/model` offers; empty with `models_error` when none could be read.
    pub models: Vec<String>,
    /// Why no list of models could be read.
    pub models_error: Option<String>,
    /// The tool calls waiting for a yes in every chat (`None`: not known here).
    pub approvals_waiting: Option<usize>,
    /// `LULL_DAILY_TOKENS` (0: none), for the overview's alerts.
    pub daily_tokens_limit: u64,
}

/// What runs, read through the console's dispatcher when there is one.
pub(super) async fn read(console: Option<&lull_core::dispatcher::Dispatcher>) -> Running {
    let mut running = Running {
        version: env!("CARGO_PKG_VERSION"),
        ..Running::default()
    };
    let Some(d) = console else {
        return running;
    };
    running.model = Some(d.console_default_model().to_owned());
    running.daily_tokens_limit = d.console_limits().daily_tokens;
    match d.console_models().await {
        Ok(models) => running.models = models,
        Err(why) => running.models_error = Some(why),
    }
    match d.console_approvals().await {
        Ok(waiting) => running.approvals_waiting = Some(waiting.len()),
        Err(e) => tracing::warn!(error = %e, "the overview could not count the approvals waiting"),
    }
    running
}

/// The overview's "what runs" section.
pub(super) fn section(out: &mut String, s: &Snapshot) {
    let r = &s.running;
    let st = &s.store;
    let _ = write!(
        out,
        "<section class=\"wide\" id=\"running\"><h2>Running lull <span id=\"version\">{}</span></h2><p>",
        esc(r.version)
    );
    if let Some(model) = &r.model {
        let offered = match (&r.models_error, r.models.is_empty()) {
            (Some(why), _) => format!("<span class=\"bad\">{}</span>", esc(why)),
            (None, true) => "none".to_owned(),
            (None, false) => esc(&r.models.join(", ")),
        };
        let _ = write!(
            out,
            "Model <code id=\"model\">{}</code> · offered by <code>/model</code>: <span id=\"models\">{offered}</span>",
            esc(model)
        );
    }
    if let Some(n) = r.approvals_waiting {
        let class = if n > 0 { " class=\"bad\"" } else { "" };
        let _ = write!(
            out,
            " · <a href=\"/approvals\">approvals waiting</a>: <span id=\"approvals-waiting\" data-value=\"{n}\"{class}>{n}</span>"
        );
    }
    let tokens = st.tokens_per_day.last().map_or(0, |d| d.tokens);
    let cost = st
        .tokens_per_day
        .last()
        .map_or(lull_core::money::Usd::ZERO, |d| d.cost);
    let _ = write!(
        out,
        "</p><p>Last 24 hours: {} replies sent, {} given up, {} model failures told. Today: {tokens} tokens, {cost}.</p></section>",
        st.sent.day, st.failed.day, st.model_failures.day
    );
}

//! lull's web tools, offered beside memory's with `LULL_TOOLS=auto`: `lull__fetch {url}`
//! (one public page as text, `LULL_FETCH`) and `lull__search {query}` (through a
//! self-hosted SearXNG, `LULL_SEARCH_URL`). Both only read: they run freely, like a
//! read-only MCP tool, and are counted in `lull_tool_calls_total{server="lull"}`.
//!
//! - `address`: which addresses may be fetched, judged on the parsed address.
//! - `fetch`: the guarded client (the checked address is the one connected to, every
//!   redirect judged, bounded in time and size) and the page as text.
//! - `search`: the SearXNG client.
//!
//! [`Web`] is built once per process (its HTTP clients are shared); each round wraps
//! its toolbox with it ([`Web::over`]).

mod address;
mod fetch;
mod search;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use ipnet::IpNet;
use serde_json::{Map, Value, json};
use url::Url;

use super::beside::{Beside, OwnTools};
use super::{CallOutcome, Effect, ToolOutput, ToolSpec, Toolbox, Users};

pub use fetch::{MAX_BYTES, MAX_REDIRECTS, TIMEOUT};

const FETCH: &str = "lull__fetch";
const SEARCH: &str = "lull__search";

/// `LULL_FETCH`, `LULL_FETCH_ALLOW`, `LULL_FETCH_USERS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchSettings {
    /// Ranges fetched although private or loopback (an intranet).
    pub allow: Vec<IpNet>,
    /// Who may have it run in a group (`admins`: only a batch of admins is offered it).
    pub users: Users,
}

/// The web tools' settings; what is `None` is not offered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebSettings {
    pub fetch: Option<FetchSettings>,
    /// `LULL_SEARCH_URL`: the SearXNG instance.
    pub search: Option<Url>,
    /// `LULL_TOOL_RESULT_CHARS`: a longer result is cut, with a note.
    pub result_chars: usize,
    /// A fetch's and a search's deadline.
    pub timeout: Duration,
}

impl Default for WebSettings {
    fn default() -> Self {
        WebSettings {
            fetch: Some(FetchSettings {
                allow: Vec::new(),
                users: Users::Allowed,
            }),
            search: None,
            result_chars: super::mcp::MAX_RESULT_CHARS,
            timeout: TIMEOUT,
        }
    }
}

/// The web tools of one process.
pub struct Web {
    fetch: Option<(fetch::Fetcher, Users)>,
    search: Option<search::Searcher>,
    result_chars: usize,
    /// How the last search went (`/healthz`): `None` before the first.
    last_search: Mutex<Option<Result<(), String>>>,
}

impl Web {
    /// The clients `settings` ask for; `Err` names what could not be built.
    pub fn new(settings: &WebSettings) -> Result<Web, String> {
        let fetch = match &settings.fetch {
            Some(f) => Some((
                fetch::Fetcher::new(f.allow.clone(), settings.timeout)?,
                f.users,
            )),
            None => None,
        };
        let search = match &settings.search {
            Some(url) => Some(
                search::Searcher::new(url, settings.timeout)
                    .map_err(|e| format!("LULL_SEARCH_URL {e}"))?,
            ),
            None => None,
        };
        Ok(Web {
            fetch,
            search,
            result_chars: settings.result_chars,
            last_search: Mutex::new(None),
        })
    }

    /// Whether any web tool is on.
    pub fn is_empty(&self) -> bool {
        self.fetch.is_none() && self.search.is_none()
    }

    /// `lull check`: whether the search service answers a query (`None`: no search).
    pub async fn probe_search(&self) -> Option<Result<(), String>> {
        Some(self.search.as_ref()?.probe().await)
    }

    /// What `/healthz` says of the web tools: each `off`, `on` (fetch), or for search
    /// `ready` (its last query answered), `failing: …` or `unknown` (none yet).
    pub fn health(&self) -> Value {
        let search = match &self.search {
            None => "off".to_owned(),
            Some(_) => match &*self.last_search.lock().unwrap_or_else(|e| e.into_inner()) {
                None => "unknown".to_owned(),
                Some(Ok(())) => "ready".to_owned(),
                Some(Err(why)) => format!("failing: {why}"),
            },
        };
        json!({
            "fetch": if self.fetch.is_some() { "on" } else { "off" },
            "search": search,
        })
    }

    /// `inner` (the MCP servers' tools, if any) with the web tools beside them.
    pub fn over(self: &Arc<Self>, inner: Option<Arc<dyn Toolbox>>) -> Arc<dyn Toolbox> {
        Beside::over(WebTools(self.clone()), inner)
    }

    /// The web tools this process offers (`lull__fetch`, `lull__search`: each only
    /// when on).
    pub fn specs(&self) -> Vec<ToolSpec> {
        let spec = |name: &str, description: &str, parameters: Value, users: Users| {
            ToolSpec::own(name, description, parameters, Effect::ReadOnly, users)
        };
        let mut specs = Vec::new();
        if let Some((_, users)) = &self.fetch {
            specs.push(spec(
                FETCH,
                "Read a public web page (http or https) as text. Private, local and cloud-metadata addresses are refused.",
                json!({
                    "type": "object",
                    "properties": {"url": {"type": "string", "description": "The page's full URL"}},
                    "required": ["url"]
                }),
                *users,
            ));
        }
        if self.search.is_some() {
            specs.push(spec(
                SEARCH,
                "Search the web: the titles, URLs and snippets of the first results.",
                json!({
                    "type": "object",
                    "properties": {"query": {"type": "string"}},
                    "required": ["query"]
                }),
                Users::Allowed,
            ));
        }
        specs
    }

    async fn fetch(&self, arguments: &Map<String, Value>) -> ToolOutput {
        let Some((fetcher, _)) = &self.fetch else {
            return error("lull__fetch is off here".into(), CallOutcome::Error);
        };
        let Some(url) = arguments.get("url").and_then(Value::as_str) else {
            return error(
                "url (the page's full URL) is needed".into(),
                CallOutcome::Error,
            );
        };
        match fetcher.fetch(url).await {
            Ok(page) => {
                let cut = if page.cut {
                    format!(
                        " (only its first {} MB was read)",
                        MAX_BYTES / (1024 * 1024)
                    )
                } else {
                    String::new()
                };
                let text = format!(
                    "{} — HTTP {}, {}{cut}:\n\n{}",
                    page.url,
                    page.status,
                    if page.content_type.is_empty() {
                        "no content type"
                    } else {
                        &page.content_type
                    },
                    page.text
                );
                ok(self.bounded(text))
            }
            Err(why @ fetch::FetchError::Timeout(_)) => {
                error(why.to_string(), CallOutcome::Timeout)
            }
            Err(why) => error(why.to_string(), CallOutcome::Error),
        }
    }

    async fn search(&self, arguments: &Map<String, Value>) -> ToolOutput {
        let Some(searcher) = &self.search else {
            return error("lull__search is off here".into(), CallOutcome::Error);
        };
        let query = arguments
            .get("query")
            .and_then(Value::as_str)
            .unwrap_or("")
            .trim();
        if query.is_empty() {
            return error("query is needed".into(), CallOutcome::Error);
        }
        let found = searcher.search(query).await;
        *self.last_search.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(found.as_ref().map(|_| ()).map_err(Clone::clone));
        match found {
            Ok(lines) => ok(self.bounded(lines)),
            Err(why) => {
                tracing::warn!(error = %why, "a web search failed");
                let outcome = if why.contains("did not answer") {
                    CallOutcome::Timeout
                } else {
                    CallOutcome::Error
                };
                error(why, outcome)
            }
        }
    }

    /// `text` within `LULL_TOOL_RESULT_CHARS`, cut with a note.
    fn bounded(&self, text: String) -> String {
        if lull_port::split::char_len(&text) <= self.result_chars {
            return text;
        }
        let note = "\n[…the rest was cut to fit]";
        let keep = self.result_chars.saturating_sub(note.len());
        let mut cut: String = text.chars().take(keep).collect();
        cut.push_str(note);
        cut
    }
}

/// The web tools as lull's own, beside a round's toolbox.
struct WebTools(Arc<Web>);

#[async_trait]
impl OwnTools for WebTools {
    fn specs(&self) -> Vec<ToolSpec> {
        self.0.specs()
    }

    fn owns(&self, name: &str) -> bool {
        name == FETCH || name == SEARCH
    }

    async fn call_own(
        &self,
        name: &str,
        arguments: Map<String, Value>,
        _key: Option<&str>,
    ) -> ToolOutput {
        if name == FETCH {
            self.0.fetch(&arguments).await
        } else {
            self.0.search(&arguments).await
        }
    }
}

fn ok(text: String) -> ToolOutput {
    ToolOutput::ok(text)
}

fn error(text: String, outcome: CallOutcome) -> ToolOutput {
    ToolOutput::error(text, outcome)
}

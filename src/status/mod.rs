//! The status page: `GET /` (server-rendered HTML with inline SVG charts, no script,
//! nothing fetched from elsewhere) and its JSON twin `GET /api/status`, with the login
//! form (`GET /login`, `POST /login`) that guards them off loopback.
//!
//! What it shows comes from one read-only store call ([`StatusStore::status`]: index
//! scans, no write lock), this process's metrics, the adapters' health and the MCP
//! servers' state. One snapshot is kept for [`CACHE_TTL`], so a refreshing browser (or
//! many) reads the database at most once per TTL.
//!
//! The overview opens with what runs ([`running`]) and the shipped alert rules its
//! numbers can judge, judged now ([`alerts`]). Every text shown is escaped ([`escape`]).
//!
//! It is also the operator's console: `/chats` and `/chats/{id}` ([`chats`]) show
//! every chat and change one through the chat commands' own store operations;
//! `/people` ([`people`]) who may use the bot and what each spent today, allowing or
//! denying a user; `/jobs` ([`jobs`]) every chat's active jobs, cancelling one;
//! `/memories` ([`memories`]) a scope's memories on request, forgetting them;
//! `/approvals` ([`approvals`]) the tool calls waiting for a yes, answering one as an
//! admin would in the chat; `/tools` ([`tools`]) the MCP servers and their tools. Each change is a form whose
//! token must be this browser's ([`csrf`]), checked before it and answered after it
//! by a redirect back ([`forms`]).
//!
//! Access ([`Access`]): with `LULL_HTTP_TOKEN` set, the page and the console need it
//! on every address, loopback included; without one, a loopback `LULL_HTTP_ADDR` is
//! open and any other closed. The token is given as `Authorization: Bearer …` or once
//! in the login form, which sets an `HttpOnly`, `SameSite=Strict` cookie holding a
//! session that expires after [`login::SESSION_LIFETIME`] (`Secure` when a proxy says
//! the request came over HTTPS), never the token ([`login`]), ended sooner by logging
//! out ([`logout`]); the form takes at most [`login::MAX_FAILURES`] wrong tokens a
//! minute, and as many wrong bearer tokens. No secret ever travels in a URL; every
//! comparison is in constant time.

mod alerts;
mod approvals;
mod chats;
mod csrf;
mod escape;
mod forms;
mod jobs;
mod login;
mod logout;
mod memories;
mod page;
mod people;
mod running;
mod tools;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use secrecy::{ExposeSecret, SecretString};
use serde::Serialize;

use lull_core::clock::Clock;
use lull_core::domain::{HolderId, Timestamp};
use lull_core::limits::TimeZone;
use lull_core::refreshed::Refreshed;
use lull_core::store::{DAYS, MemoryCounts, StatusQuery, Store, StoreStatus};
use lull_core::tools::ServerState;
use lull_port::health::Health;

/// How long one snapshot is served before the store is read again.
pub(crate) const CACHE_TTL: Duration = Duration::from_secs(2);
/// Conversations in the "top by tokens today" table.
const TOP: usize = 10;
/// The cookie the login form sets.
const COOKIE: &str = "lull_status";

/// Who may see the status page, decided once from `LULL_HTTP_ADDR` and
/// `LULL_HTTP_TOKEN`.
#[derive(Clone)]
pub(crate) enum Access {
    /// A loopback address: whoever can reach it is on this host.
    Open,
    /// Off loopback with a token: the bearer token, or the login form's cookie.
    Token {
        token: SecretString,
        /// The sessions the login form's cookie holds (derived from the token, never
        /// the token).
        sessions: login::Sessions,
    },
    /// Off loopback without a token: refused, naming the variable to set.
    Closed,
}

impl Access {
    /// The rule for a server on `addr` with `token` (`LULL_HTTP_TOKEN`).
    pub(crate) fn new(addr: std::net::SocketAddr, token: Option<SecretString>) -> Access {
        match token {
            // Once a token is set it is needed on every address: a reverse proxy on
            // this host would otherwise publish a console that changes chats.
            Some(token) => {
                let sessions = login::Sessions::new(&token);
                Access::Token { token, sessions }
            }
            None if addr.ip().is_loopback() => Access::Open,
            None => Access::Closed,
        }
    }
}

/// The hook that names each MCP server's state (`Toolbox::servers` of the dispatcher's
/// toolbox, asked at each read, so a toolbox set after the router was built is shown).
pub(crate) type McpServers = Arc<dyn Fn() -> Vec<ServerState> + Send + Sync>;

/// Everything the status routes read, and the snapshot they share.
#[derive(Clone)]
pub(crate) struct StatusPage {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    health: Health,
    metrics: Option<PrometheusHandle>,
    clock: Arc<dyn Clock>,
    /// `LULL_TIMEZONE`: the days tokens are counted by, as for `/usage` and budgets.
    timezone: TimeZone,
    /// `LULL_MONTHLY_USD`, shown against the month so far.
    monthly_budget: lull_core::money::Usd,
    /// The dispatcher the console's changes go through (`None`: the pages only show).
    console: Option<Arc<lull_core::dispatcher::Dispatcher>>,
    access: Access,
    /// This process as a lease holder (`None`: not known, as in tests of the router).
    holder: Option<HolderId>,
    /// The MCP servers' state, asked at each read (`None`: no tools in this build or
    /// process; the page then shows no MCP section).
    mcp_servers: Option<McpServers>,
    /// The snapshot as last read, read again once older than [`CACHE_TTL`].
    cache: Refreshed<Snapshot, Infallible>,
    /// Wrong tokens the login form was given lately.
    failures: login::Failures,
    /// Wrong `Authorization: Bearer` tokens lately, limited as the login form's are.
    bearer_failures: login::Failures,
}

/// What the page and `/api/status` show: one moment's numbers.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Snapshot {
    /// When it was read, in milliseconds since the Unix epoch.
    pub generated_at: i64,
    /// `ok`, or why the database did not answer (then `store` is empty).
    pub database: String,
    /// What the database knows: every replica's work.
    pub store: StoreStatus,
    /// This process alone, since it started (what only its metrics know).
    pub process: ProcessStatus,
    /// Each configured platform adapter's state, as `/healthz` reports it.
    pub platforms: BTreeMap<String, String>,
    /// Each configured MCP server (empty without tools).
    pub mcp_servers: Vec<ServerState>,
    /// How many memories are kept, by scope (counts only: never a text).
    pub memories: MemoryCounts,
    /// `LULL_MONTHLY_USD` (0: none), shown against the month's dollars.
    pub monthly_budget: lull_core::money::Usd,
    /// What runs: the version, the model and models, the approvals waiting.
    pub running: running::Running,
    /// The shipped alert rules these numbers can judge, judged now ([`alerts`]).
    pub alerts: Vec<alerts::Condition>,
}

#[cfg(test)]
impl Snapshot {
    /// A snapshot of a sound, idle deployment serving http alone: what unit tests
    /// change.
    pub(super) fn idle() -> Snapshot {
        Snapshot {
            generated_at: 0,
            database: "ok".into(),
            store: StoreStatus::default(),
            process: ProcessStatus::default(),
            platforms: [("http".to_owned(), "up".to_owned())].into(),
            mcp_servers: Vec::new(),
            memories: MemoryCounts::default(),
            monthly_budget: lull_core::money::Usd::ZERO,
            running: running::Running::default(),
            alerts: Vec::new(),
        }
    }
}

/// This process's own counters, read from its metrics.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct ProcessStatus {
    /// Its lease holder id (matches a row of the store's holders while it holds one).
    pub holder: Option<String>,
    /// Replies it dropped because a newer message arrived (never stored, so only here).
    pub replies_dropped_stale: u64,
    /// Model requests by outcome (`ok`, `error`, …).
    pub llm_requests: BTreeMap<String, u64>,
}

impl StatusPage {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        store: Arc<dyn Store>,
        health: Health,
        metrics: Option<PrometheusHandle>,
        (clock, timezone): (Arc<dyn Clock>, TimeZone),
        access: Access,
        holder: Option<HolderId>,
        mcp_servers: Option<McpServers>,
    ) -> StatusPage {
        StatusPage {
            inner: Arc::new(Inner {
                store,
                health,
                metrics,
                clock,
                timezone,
                monthly_budget: lull_core::money::Usd::ZERO,
                console: None,
                access,
                holder,
                mcp_servers,
                cache: Refreshed::default(),
                failures: login::Failures::default(),
                bearer_failures: login::Failures::default(),
            }),
        }
    }

    /// Show the month's dollars against `budget` (`LULL_MONTHLY_USD`). Call before
    /// the page is shared (its routes cloned).
    pub(crate) fn with_monthly_budget(mut self, budget: lull_core::money::Usd) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.monthly_budget = budget;
        }
        self
    }

    /// Let the console change chats through `dispatcher` (the chat commands' store
    /// operations). Call before the page is shared (its routes cloned).
    pub(crate) fn with_console(
        mut self,
        dispatcher: Arc<lull_core::dispatcher::Dispatcher>,
    ) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.console = Some(dispatcher);
        }
        self
    }

    /// The routes: `/`, `/api/status`, `/login`, and the console's `/chats`.
    pub(crate) fn routes(self) -> Router {
        Router::new()
            .route("/", get(page))
            .route("/api/status", get(api))
            .route("/login", get(login_form).post(login))
            .route("/logout", get(logout::form).post(logout::end))
            .route("/chats", get(chats::list))
            .route("/chats/{id}", get(chats::detail).post(chats::change))
            .route("/people", get(people::page).post(people::change))
            .route("/jobs", get(jobs::page).post(jobs::cancel))
            .route("/memories", get(memories::page).post(memories::change))
            .route("/approvals", get(approvals::page).post(approvals::answer))
            .route("/tools", get(tools::page))
            .with_state(self)
    }

    /// The snapshot, read again when the kept one is older than [`CACHE_TTL`]. Callers
    /// arriving meanwhile wait for that one read instead of starting their own.
    async fn snapshot(&self) -> Arc<Snapshot> {
        let read = self
            .inner
            .cache
            .get(CACHE_TTL, || async { Ok(self.read().await) })
            .await;
        match read {
            Ok(snapshot) => snapshot,
            Err(never) => match never {},
        }
    }

    async fn read(&self) -> Snapshot {
        let inner = &self.inner;
        let now = inner.clock.now();
        let asked = StatusQuery {
            now,
            top: TOP,
            days: inner.timezone.days_up_to(now, DAYS),
            today_since: inner.timezone.day_start(now),
        };
        let (database, store) = match inner.store.status(asked).await {
            Ok(status) => ("ok".to_owned(), status),
            Err(e) => {
                tracing::warn!(error = %e, "the status page could not read the database");
                (e.to_string(), StoreStatus::default())
            }
        };
        let memories = match inner.store.memory_counts().await {
            Ok(counts) => counts,
            Err(e) => {
                tracing::warn!(error = %e, "the status page could not count the memories");
                MemoryCounts::default()
            }
        };
        let mut process = inner
            .metrics
            .as_ref()
            .map(|m| process_status(&m.render()))
            .unwrap_or_default();
        process.holder = inner.holder.as_ref().map(|h| h.as_str().to_owned());
        let running = running::read(inner.console.as_deref()).await;
        let mut snapshot = Snapshot {
            generated_at: now.0,
            database,
            store,
            process,
            platforms: inner
                .health
                .snapshot()
                .iter()
                .map(|(platform, state)| (platform.as_str().to_owned(), state.describe()))
                .collect(),
            mcp_servers: inner.mcp_servers.as_ref().map(|f| f()).unwrap_or_default(),
            memories,
            monthly_budget: inner.monthly_budget,
            running,
            alerts: Vec::new(),
        };
        snapshot.alerts = alerts::judge(&snapshot);
        snapshot
    }

    /// The answer to a request that may not see the page (`None`: it may).
    fn refusal(&self, headers: &HeaderMap, json: bool) -> Option<Response> {
        match &self.inner.access {
            Access::Open => None,
            Access::Closed => Some((
                StatusCode::FORBIDDEN,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                "The status page is off: LULL_HTTP_ADDR is not a loopback address. Set LULL_HTTP_TOKEN to open it with that token.\n",
            )
                .into_response()),
            Access::Token { token, sessions } => {
                let now = self.inner.clock.now();
                if has_session(headers, sessions, now) {
                    return None;
                }
                if let Some(right) = bearer(headers, token) {
                    // Guessed no faster than through the login form.
                    let tried = std::time::Instant::now();
                    if let Err(wait) = self.inner.bearer_failures.check(tried) {
                        return Some(too_many_tries(wait, json));
                    }
                    if right {
                        return None;
                    }
                    self.inner.bearer_failures.record(tried);
                }
                if json {
                    Some((
                        StatusCode::UNAUTHORIZED,
                        [(header::WWW_AUTHENTICATE, "Bearer")],
                        axum::Json(serde_json::json!({
                            "error": "send Authorization: Bearer $LULL_HTTP_TOKEN"
                        })),
                    )
                        .into_response())
                } else {
                    Some(html(StatusCode::UNAUTHORIZED, page::login(None)))
                }
            }
        }
    }
}

async fn page(State(status): State<StatusPage>, headers: HeaderMap) -> Response {
    if let Some(refused) = status.refusal(&headers, false) {
        return refused;
    }
    let snapshot = status.snapshot().await;
    html(StatusCode::OK, page::render(&snapshot))
}

async fn api(State(status): State<StatusPage>, headers: HeaderMap) -> Response {
    if let Some(refused) = status.refusal(&headers, true) {
        return refused;
    }
    let snapshot = status.snapshot().await;
    let code = if snapshot.database == "ok" {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        code,
        [(header::CACHE_CONTROL, "no-store")],
        axum::Json(&*snapshot),
    )
        .into_response()
}

async fn login_form(State(status): State<StatusPage>) -> Response {
    match status.inner.access {
        Access::Token { .. } => html(StatusCode::OK, page::login(None)),
        // Nothing to log in to: the page is open, or off whatever is typed.
        Access::Open => redirect_home(None, false),
        Access::Closed => status
            .refusal(&HeaderMap::new(), false)
            .expect("closed access refuses"),
    }
}

/// `POST /login` with the form body `token=…`: the right token sets the cookie and goes
/// to the page; a wrong one is refused with the form again (401).
async fn login(State(status): State<StatusPage>, headers: HeaderMap, body: Bytes) -> Response {
    let Access::Token { token, sessions } = &status.inner.access else {
        return login_form(State(status)).await;
    };
    let tried = std::time::Instant::now();
    if let Err(wait) = status.inner.failures.check(tried) {
        return too_many_tries(wait, false);
    }
    let given = url::form_urlencoded::parse(&body)
        .find(|(name, _)| name == "token")
        .map(|(_, value)| value.into_owned())
        .unwrap_or_default();
    if same_secret(given.trim().as_bytes(), token.expose_secret().as_bytes()) {
        let session = sessions.issue(status.inner.clock.now());
        redirect_home(Some(&session), over_https(&headers))
    } else {
        status.inner.failures.record(tried);
        tracing::info!("the status page's login form was given a wrong token");
        html(
            StatusCode::UNAUTHORIZED,
            page::login(Some("That is not the token (LULL_HTTP_TOKEN).")),
        )
    }
}

/// Whether a reverse proxy says the request came over HTTPS (`X-Forwarded-Proto`, or
/// `Forwarded: proto=https`): lull itself serves plain HTTP.
fn over_https(headers: &HeaderMap) -> bool {
    let said = |name: &str| {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(str::to_ascii_lowercase)
            .collect::<Vec<_>>()
    };
    said("x-forwarded-proto")
        .iter()
        .any(|v| v.trim() == "https")
        || said("forwarded").iter().any(|v| v.contains("proto=https"))
}

fn redirect_home(session: Option<&str>, secure: bool) -> Response {
    let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, "/")]).into_response();
    let max_age = Some(login::SESSION_LIFETIME.as_secs());
    if let Some(value) = session
        && let Some(set) = set_cookie(COOKIE, value, max_age, secure)
    {
        response.headers_mut().insert(header::SET_COOKIE, set);
    }
    response
}

/// Whether the lease `resource` is `platform`'s connection (`poller/telegram`, or one
/// shard's, `poller/discord/shard-1`).
fn polls(resource: &str, platform: &str) -> bool {
    resource
        .strip_prefix("poller/")
        .is_some_and(|r| r.split('/').next() == Some(platform))
}

/// The `Set-Cookie` value of every cookie the console sets: `HttpOnly`,
/// `SameSite=Strict`, the whole site, `Secure` when the browser came over HTTPS; kept
/// `max_age` seconds (`None`: for the browser's session; `Some(0)`: cleared).
fn set_cookie(name: &str, value: &str, max_age: Option<u64>, secure: bool) -> Option<HeaderValue> {
    let max_age = max_age
        .map(|s| format!("; Max-Age={s}"))
        .unwrap_or_default();
    let secure = if secure { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{name}={value}; HttpOnly; SameSite=Strict; Path=/{max_age}{secure}"
    ))
    .ok()
}

fn html(code: StatusCode, body: String) -> Response {
    (
        code,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

/// Whether `Authorization: Bearer <token>` (the scheme name case-insensitive) names
/// the token, compared in constant time; `None`: the request names no bearer token.
fn bearer(headers: &HeaderMap, token: &SecretString) -> Option<bool> {
    let mut given = headers
        .get_all(header::AUTHORIZATION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|v| v.trim_start().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .peekable();
    given.peek()?;
    Some(
        given.any(|(_, given)| {
            same_secret(given.trim().as_bytes(), token.expose_secret().as_bytes())
        }),
    )
}

/// 429 with `Retry-After` once too many wrong tokens were given lately (a page's login
/// form again, or a JSON error).
fn too_many_tries(wait: Duration, json: bool) -> Response {
    let said = "Too many wrong tokens: wait a minute and try again.";
    let mut response = if json {
        (
            StatusCode::TOO_MANY_REQUESTS,
            axum::Json(serde_json::json!({ "error": said })),
        )
            .into_response()
    } else {
        html(StatusCode::TOO_MANY_REQUESTS, page::login(Some(said)))
    };
    if let Ok(value) = HeaderValue::from_str(&wait.as_secs().max(1).to_string()) {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
}

/// Whether a `Cookie` header carries a login cookie holding a session open at `now`.
fn has_session(headers: &HeaderMap, sessions: &login::Sessions, now: Timestamp) -> bool {
    cookies(headers, COOKIE)
        .iter()
        .any(|value| sessions.valid(value, now))
}

/// The values of the cookie `name` the request carries (every `Cookie` header).
fn cookies(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(|(n, _)| *n == name)
        .map(|(_, value)| value.to_owned())
        .collect()
}

/// Equal bytes, in a time that depends on the lengths alone.
fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    lull_adapters::http::same_secret(given, expected)
}

/// This process's counters in the Prometheus text `rendered`.
fn process_status(rendered: &str) -> ProcessStatus {
    use lull_core::metrics::{LLM_REQUESTS, REPLIES_DROPPED_STALE};
    let mut status = ProcessStatus::default();
    for line in rendered.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        if name == REPLIES_DROPPED_STALE {
            status.replies_dropped_stale += value as u64;
        } else if name == LLM_REQUESTS {
            let outcome = labels
                .split(',')
                .find_map(|l| l.strip_prefix("outcome=\""))
                .and_then(|l| l.split('"').next())
                .unwrap_or("unknown");
            *status.llm_requests.entry(outcome.to_owned()).or_default() += value as u64;
        }
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_process_counters_are_read_from_the_metrics_text() {
        let text = "# TYPE lull_llm_requests_total counter\n\
                    lull_llm_requests_total{outcome=\"ok\"} 3\n\
                    lull_llm_requests_total{model=\"m\",outcome=\"error\"} 1\n\
                    lull_replies_dropped_stale_total 2\n\
                    lull_replies_sent_total 9\n";
        let status = process_status(text);
        assert_eq!(status.replies_dropped_stale, 2);
        assert_eq!(
            status.llm_requests,
            BTreeMap::from([("error".to_owned(), 1), ("ok".to_owned(), 3)])
        );
    }

    #[test]
    fn access_follows_the_address_and_the_token() {
        let token = || Some(SecretString::from("s3cret"));
        let loopback = "127.0.0.1:8080".parse().unwrap();
        let anywhere = "0.0.0.0:8080".parse().unwrap();
        assert!(
            matches!(Access::new(loopback, token()), Access::Token { .. }),
            "a token set is needed on loopback too (a proxy on this host would publish the console)"
        );
        assert!(matches!(Access::new(loopback, None), Access::Open));
        assert!(matches!(Access::new(anywhere, None), Access::Closed));
        let Access::Token { sessions, .. } = Access::new(anywhere, token()) else {
            panic!("a token opens a non-loopback page");
        };
        let now = Timestamp(1_700_000_000_000);
        let cookie = sessions.issue(now);
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("a=b; {COOKIE}={cookie}")).unwrap(),
        );
        assert!(has_session(&headers, &sessions, now));
        assert!(!has_session(
            &headers,
            &sessions,
            now.plus(login::SESSION_LIFETIME)
        ));
        assert!(!has_session(
            &headers,
            &login::Sessions::new(&SecretString::from("other")),
            now
        ));
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bearer s3cret"),
        );
        assert_eq!(bearer(&headers, &SecretString::from("s3cret")), Some(true));
        assert_eq!(bearer(&headers, &SecretString::from("s3cre")), Some(false));
        assert_eq!(
            bearer(&HeaderMap::new(), &SecretString::from("s3cret")),
            None
        );
    }
}

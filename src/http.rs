//! The HTTP server: `GET /healthz`, `GET /metrics`, the status page (`GET /`,
//! `GET /api/status`, `/login`: `crate::status`), and the http adapter's routes when it
//! is enabled. [`app`] builds the router without a socket, so tests can call it
//! directly.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;

use lull_core::store::Store;
use lull_core::tools::Toolbox;
use lull_port::health::Health;

/// What the health and metrics endpoints read.
#[derive(Clone)]
pub(crate) struct HttpState {
    pub store: Arc<dyn Store>,
    pub health: Health,
    /// `None` when no recorder is installed (tests of the router alone).
    pub metrics: Option<PrometheusHandle>,
    /// The MCP servers' states for `/healthz` (`None`: tools off).
    pub tools: Option<Arc<dyn Toolbox>>,
    /// lull's web tools, for `/healthz` (`None`: off).
    pub web: Option<Arc<lull_core::tools::web::Web>>,
    /// The status page's routes (`None`: not served, as in tests of the router alone).
    pub status: Option<crate::status::StatusPage>,
    /// The spending limits: with `LULL_DAILY_TOKENS` set, each scrape reads today's
    /// bot-wide use from the store (`lull_daily_tokens_used`).
    pub limits: lull_core::limits::Limits,
    /// The clock that says which day it is for the budget.
    pub clock: Arc<dyn lull_core::clock::Clock>,
}

/// The router: health, metrics, the status page, and `extra` routes (the http adapter)
/// if given.
pub(crate) fn app(state: HttpState, extra: Option<Router>) -> Router {
    let status = state.status.clone();
    let router = Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .with_state(state);
    let router = match status {
        Some(status) => router.merge(status.routes()),
        None => router,
    };
    match extra {
        Some(extra) => router.merge(extra),
        None => router,
    }
}

/// 200 when the database answers and every configured adapter is up (or standing
/// by), 503 otherwise; the body says which part is unwell. With tools on, `mcp` lists
/// each MCP server's state; a server that is down does not make lull unhealthy (it
/// still answers, without that server's tools).
async fn healthz(State(state): State<HttpState>) -> Response {
    let database = state.store.ping().await;
    let adapters = state.health.snapshot();
    let healthy = database.is_ok() && adapters.values().all(|a| a.is_healthy());
    let mut body = json!({
        "status": if healthy { "ok" } else { "unavailable" },
        "database": match &database {
            Ok(()) => "ok".to_owned(),
            Err(e) => e.to_string(),
        },
        "adapters": adapters
            .iter()
            .map(|(platform, state)| (platform.as_str().to_owned(), state.describe().into()))
            .collect::<serde_json::Map<_, _>>(),
    });
    if let Some(web) = &state.web {
        body["web"] = web.health();
    }
    if let Some(tools) = &state.tools {
        body["mcp"] = json!(tools.servers());
    }
    let status = if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

/// The budget gauges read from the store at scrape time: the bot's tokens today
/// against `LULL_DAILY_TOKENS`, its dollars this month against `LULL_MONTHLY_USD`
/// (each while set): the same numbers on every replica.
async fn budget_gauges(state: &HttpState) {
    use lull_core::limits::{BOT_MONTH_SCOPE, BOT_SCOPE};
    use lull_core::metrics::{
        DAILY_TOKENS_LIMIT, DAILY_TOKENS_USED, MONTH_COST_USD, MONTHLY_BUDGET_USD,
    };
    let limits = &state.limits;
    let now = state.clock.now();
    if limits.daily_tokens > 0 {
        let day = limits.timezone.day(now);
        match state.store.token_usage(&day, &[BOT_SCOPE.to_owned()]).await {
            Ok(used) => {
                metrics::gauge!(DAILY_TOKENS_USED).set(used[0].tokens as f64);
                metrics::gauge!(DAILY_TOKENS_LIMIT).set(limits.daily_tokens as f64);
            }
            Err(e) => tracing::debug!(error = %e, "could not read today's token use for /metrics"),
        }
    }
    if limits.monthly_usd.is_set() {
        let month = limits.timezone.month(now);
        match state
            .store
            .token_usage(&month, &[BOT_MONTH_SCOPE.to_owned()])
            .await
        {
            Ok(used) => {
                metrics::gauge!(MONTH_COST_USD).set(used[0].cost.dollars());
                metrics::gauge!(MONTHLY_BUDGET_USD).set(limits.monthly_usd.dollars());
            }
            Err(e) => tracing::debug!(error = %e, "could not read this month's cost for /metrics"),
        }
    }
}

/// The gauges read at scrape time (what `/healthz` reads), then every metric.
async fn metrics(State(state): State<HttpState>) -> Response {
    use lull_core::metrics::{DATABASE_UP, PLATFORM_CONNECTED};
    let database_up = state.store.ping().await.is_ok();
    metrics::gauge!(DATABASE_UP).set(if database_up { 1.0 } else { 0.0 });
    if database_up {
        budget_gauges(&state).await;
    }
    for (platform, adapter) in state.health.snapshot() {
        let connected = matches!(adapter, lull_port::health::AdapterState::Up);
        metrics::gauge!(PLATFORM_CONNECTED, "platform" => platform.as_str()).set(if connected {
            1.0
        } else {
            0.0
        });
    }
    match state.metrics {
        Some(handle) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            handle.render() + &lull_core::metrics::render_costs(),
        )
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            "metrics are not enabled in this process\n",
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use serde_json::Value;
    use tower::ServiceExt;

    use super::*;

    /// The router alone (no socket): `/healthz` is 503 while an adapter is down.
    #[tokio::test]
    async fn healthz_is_503_while_an_adapter_is_down() {
        let dir = tempfile::tempdir().unwrap();
        let store = std::sync::Arc::new(
            lull_core::store::SqliteStore::open(
                dir.path().join("lull.db"),
                lull_core::dispatcher::DispatchSettings::default().timers,
            )
            .unwrap(),
        );
        let health = lull_port::health::Health::default();
        health.set(
            lull_core::domain::Platform::Telegram,
            lull_port::health::AdapterState::Down("getUpdates failed".into()),
        );
        let app = app(
            HttpState {
                store,
                health: health.clone(),
                metrics: None,
                tools: None,
                web: None,
                status: None,
                limits: lull_core::limits::Limits::default(),
                clock: std::sync::Arc::new(lull_core::clock::SystemClock),
            },
            None,
        );
        let get = |app: axum::Router| async move {
            let response = app
                .oneshot(Request::get("/healthz").body(Body::empty()).unwrap())
                .await
                .unwrap();
            let status = response.status();
            let body = axum::body::to_bytes(response.into_body(), 1 << 20)
                .await
                .unwrap();
            (status, serde_json::from_slice::<Value>(&body).unwrap())
        };
        let (status, body) = get(app.clone()).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body["adapters"]["telegram"], "down: getUpdates failed");
        health.set(
            lull_core::domain::Platform::Telegram,
            lull_port::health::AdapterState::Standby,
        );
        let (status, body) = get(app).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
}

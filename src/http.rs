//! The HTTP server: `GET /healthz`, `GET /metrics`, and the http adapter's routes when
//! it is enabled. [`app`] builds the router without a socket, so tests can call it
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

use crate::health::Health;
use crate::store::Store;

/// What the health and metrics endpoints read.
#[derive(Clone)]
pub struct HttpState {
    pub store: Arc<dyn Store>,
    pub health: Health,
    /// `None` when no recorder is installed (tests of the router alone).
    pub metrics: Option<PrometheusHandle>,
}

/// The router: health, metrics, and `extra` routes (the http adapter) if given.
pub fn app(state: HttpState, extra: Option<Router>) -> Router {
    let router = Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .with_state(state);
    match extra {
        Some(extra) => router.merge(extra),
        None => router,
    }
}

/// 200 when the database answers and every configured adapter is up (or standing
/// by), 503 otherwise; the body says which part is unwell.
async fn healthz(State(state): State<HttpState>) -> Response {
    let database = state.store.ping().await;
    let adapters = state.health.snapshot();
    let healthy = database.is_ok() && adapters.values().all(|a| a.is_healthy());
    let body = json!({
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
    let status = if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

async fn metrics(State(state): State<HttpState>) -> Response {
    match state.metrics {
        Some(handle) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            handle.render(),
        )
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            "metrics are not enabled in this process\n",
        )
            .into_response(),
    }
}

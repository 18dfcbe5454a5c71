//! The Prometheus exporter behind `GET /metrics`. The metric names and their
//! descriptions are the core's ([`lull_core::metrics`]).

use lull_core::metrics::*;

/// Install the Prometheus recorder for this process (once) and return the handle that
/// renders `/metrics`. Histograms get buckets; counters start at zero so dashboards
/// see them before the first event.
pub(crate) fn install() -> Result<metrics_exporter_prometheus::PrometheusHandle, String> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(LLM_SECONDS.into()),
            &[0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0],
        )
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(BATCH_MESSAGES.into()),
                &[1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0],
            )
        })
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(TOOL_CALL_SECONDS.into()),
                &[0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0],
            )
        })
        .map_err(|e| e.to_string())?
        .install_recorder()
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    describe();
    for counter in [
        MESSAGES_INGESTED,
        REPLIES_SENT,
        REPLIES_FAILED,
        REPLIES_DROPPED_STALE,
        LEASE_CONTENDED,
    ] {
        metrics::counter!(counter).increment(0);
    }
    // The denominator of "model calls per reply": present from the start, so a
    // query over a window that saw the first call counts it.
    metrics::counter!(LLM_REQUESTS, "outcome" => "ok").increment(0);
    metrics::gauge!(PENDING_CONVERSATIONS).set(0.0);
    Ok(handle)
}

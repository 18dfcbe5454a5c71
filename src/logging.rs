//! Logs go to standard error (standard output carries `lull chat`'s replies), as
//! readable text or as JSON lines for machines.

use tracing_subscriber::EnvFilter;

use crate::config::{ConfigError, LogFormat};

/// Targets capped below trace whatever the filter says: at trace the WebSocket
/// library logs raw outgoing frames, and Discord's IDENTIFY frame carries the bot
/// token. Secrets never appear in logs, even when debugging.
const SECRET_SAFE: &str = "tungstenite=debug,tokio_tungstenite=debug";

/// Install the global subscriber. The filter uses tracing's `EnvFilter` syntax.
pub fn init(format: LogFormat, filter: &str) -> Result<(), ConfigError> {
    let filter = EnvFilter::try_new(filter).map_err(|e| {
        ConfigError(format!(
            "RUST_LOG is not a valid log filter ('{filter}'): {e}"
        ))
    })?;
    let filter = SECRET_SAFE.split(',').fold(filter, |filter, directive| {
        filter.add_directive(directive.parse().expect("a valid directive"))
    });
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
    // Already installed (tests): keep the first.
    drop(result);
    Ok(())
}

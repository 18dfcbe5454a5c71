//! Logs go to standard error (standard output carries `lull chat`'s replies), as
//! readable text or as JSON lines for machines.
//!
//! Invariant: no log line carries a registered secret. Every formatted event passes
//! [`lull_port::secrets::redact`] on its way to standard error, whatever a boundary did
//! or forgot to do before logging it.

use std::io::Write;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

use crate::config::{ConfigError, LogFormat};

/// Targets capped below trace whatever the filter says: at trace the WebSocket
/// library logs raw outgoing frames, and Discord's IDENTIFY frame carries the bot
/// token. Secrets never appear in logs, even when debugging.
const SECRET_SAFE: &str = "tungstenite=debug,tokio_tungstenite=debug";

/// Install the global subscriber. The filter uses tracing's `EnvFilter` syntax.
/// Secrets registered before or after this call never reach the output.
pub(crate) fn init(format: LogFormat, filter: &str) -> Result<(), ConfigError> {
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
        .with_writer(RedactingStderr);
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

/// Standard error, one redacted event at a time: the formatter writes an event into
/// an [`EventBuffer`], which redacts it whole (a secret is never split between two
/// writes) and writes it out when dropped.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RedactingStderr;

impl<'a> MakeWriter<'a> for RedactingStderr {
    type Writer = EventBuffer<std::io::Stderr>;

    fn make_writer(&'a self) -> Self::Writer {
        EventBuffer::new(std::io::stderr())
    }
}

/// One formatted event on its way to `out`, redacted when dropped.
pub(crate) struct EventBuffer<W: Write> {
    text: Vec<u8>,
    out: W,
}

impl<W: Write> EventBuffer<W> {
    pub(crate) fn new(out: W) -> Self {
        Self {
            text: Vec::with_capacity(256),
            out,
        }
    }
}

impl<W: Write> Write for EventBuffer<W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.text.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<W: Write> Drop for EventBuffer<W> {
    fn drop(&mut self) {
        if self.text.is_empty() {
            return;
        }
        let redacted = lull_port::secrets::redact(String::from_utf8_lossy(&self.text));
        // A log line that cannot be written has nowhere else to go.
        let _ = self.out.write_all(redacted.as_bytes());
        let _ = self.out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_redacted_whole_even_when_written_in_pieces() {
        lull_port::secrets::register(&secrecy::SecretString::from("sk-log-writer-secret"));
        let mut out = Vec::new();
        {
            let mut event = EventBuffer::new(&mut out);
            event.write_all(b"model said: Bearer sk-log-").unwrap();
            event.write_all(b"writer-secret is wrong\n").unwrap();
        }
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "model said: Bearer <redacted> is wrong\n"
        );
    }
}

//! The `lull` binary: read the configuration, set up logging, run a command.
//!
//! Every configured secret is registered for redaction before anything is logged or
//! printed, and every error printed here passes [`redact`] too.
//!
//! - [`config`]: every variable and its flag, parsed and checked together.
//! - [`logging`]: text or JSON lines on standard error, every line redacted.
//! - [`app`]: the wiring behind `lull run` and `lull chat`.
//! - [`check`]: `lull check` (the configuration and every connection it names) and
//!   `lull healthcheck`.
//! - [`backup`]: `lull backup PATH`.
//! - [`http`]: the HTTP server (`/healthz`, `/metrics`, the http adapter's routes);
//!   [`metrics`]: the Prometheus exporter behind `/metrics`; [`status`]: the status
//!   page and its login.

use std::process::ExitCode;

mod app;
mod backup;
mod check;
mod config;
mod http;
mod logging;
mod metrics;
mod status;

use crate::config::{Cli, Command, Config};
use lull_port::secrets::redact;

fn main() -> ExitCode {
    if let Err(e) = dotenvy::dotenv()
        && !e.not_found()
    {
        match e {
            // dotenvy quotes the whole line, which may hold a secret: only where it is.
            dotenvy::Error::LineParse(line, at) => eprintln!(
                "lull: cannot read .env: {} does not parse (at character {at}; not shown, it may hold a secret)",
                env_line_number(&line).map_or_else(|| "a line".to_owned(), |n| format!("line {n}"))
            ),
            e => eprintln!("lull: cannot read .env: {e}"),
        }
        return ExitCode::from(2);
    }
    let cli = Cli::parse_or_exit();
    // A typo in a setting's name must not fail open (a budget silently off).
    let names: Vec<String> = std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .collect();
    let ignore = std::env::var(crate::config::IGNORE_VARIABLE).ok();
    let unknown =
        crate::config::unknown_variables(names.iter().map(String::as_str), ignore.as_deref());
    if !unknown.is_empty() {
        for line in &unknown {
            eprintln!("lull: {line}");
        }
        eprintln!(
            "lull: not started: fix the names above, or list variables meant for something else in {} (comma-separated)",
            crate::config::IGNORE_VARIABLE
        );
        return ExitCode::from(2);
    }
    for secret in cli.settings.secrets() {
        lull_port::secrets::register(secret);
    }
    if let Some(password) = lull_core::store::DatabaseUrl::parse(&cli.settings.database_url)
        .ok()
        .and_then(|url| url.password())
    {
        lull_port::secrets::register(&password);
    }
    let command = cli.command.unwrap_or(Command::Run);
    let default_filter = match command {
        Command::Run => "info",
        // Its report says it all; the MCP SDK's own lines would only repeat it worse.
        Command::Check => "off",
        Command::Chat | Command::Healthcheck | Command::Backup { .. } => "warn",
    };
    let filter = cli.settings.log_filter.as_deref().unwrap_or(default_filter);
    if let Err(e) = crate::logging::init(cli.settings.log_format, filter) {
        eprintln!("lull: {e}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("lull: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if command == Command::Healthcheck {
        return match runtime.block_on(crate::check::healthcheck(cli.settings.http.http_addr)) {
            Ok(body) => {
                println!("{body}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("lull: unhealthy: {}", redact(e));
                ExitCode::FAILURE
            }
        };
    }
    // A backup needs only DATABASE_URL: the rest of a configuration being wrong must not
    // stand between an operator and a copy of their data.
    if let Command::Backup { path } = &command {
        return crate::backup::run(&cli.settings.database_url, path);
    }
    let config = match Config::from_settings(&cli.settings) {
        Ok(config) => config,
        Err(e) if command == Command::Check => {
            println!("FAIL  configuration {}", redact(e));
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("lull: {}", redact(e));
            return ExitCode::from(2);
        }
    };
    if command == Command::Check {
        let findings = runtime.block_on(crate::check::run(&config));
        for finding in &findings {
            println!("{}", redact(finding));
        }
        return if findings.iter().all(|f| f.ok) {
            println!("all checks passed");
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let result = runtime.block_on(async {
        match command {
            Command::Chat => crate::app::chat(config, ctrl_c()).await,
            Command::Run => crate::app::run(config, shutdown_signal())
                .await
                .map(|()| ExitCode::SUCCESS),
            Command::Check | Command::Healthcheck | Command::Backup { .. } => {
                unreachable!("handled above")
            }
        }
    });
    // Blocking work still running (a database call waiting out a lock) does not hold
    // the exit back: `lull run` has already stopped within its shutdown deadline.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("lull: {}", redact(format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}

/// The line number of `line` in the `.env` file dotenvy read (the first one in the
/// current folder or above it), if it can be found again.
fn env_line_number(line: &str) -> Option<usize> {
    let path = std::env::current_dir()
        .ok()?
        .ancestors()
        .map(|dir| dir.join(".env"))
        .find(|path| path.is_file())?;
    let text = std::fs::read_to_string(path).ok()?;
    // A value spanning lines is reported whole: its first line is where it starts.
    let wanted = line.lines().next()?.trim();
    text.lines().position(|l| l.trim() == wanted).map(|i| i + 1)
}

async fn ctrl_c() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// SIGTERM (docker stop) or SIGINT (Ctrl-C).
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    () = ctrl_c() => {}
                }
            }
            Err(_) => ctrl_c().await,
        }
    }
    #[cfg(not(unix))]
    ctrl_c().await;
}

//! `lull backup PATH`: a consistent copy of the SQLite database, safe while lull runs
//! (see `lull_core::store::backup`); for PostgreSQL it names `pg_dump` and fails.

use std::path::Path;
use std::process::ExitCode;

use lull_core::store::DatabaseUrl;
use lull_core::store::backup::backup;
use lull_port::secrets::redact;

/// Back up the database `database_url` names to `target`; the exit code says whether
/// a checked copy exists now.
pub(crate) fn run(database_url: &str, target: &Path) -> ExitCode {
    let url = match DatabaseUrl::parse(database_url) {
        Ok(url) => url,
        Err(e) => {
            eprintln!("lull: {}", redact(e));
            return ExitCode::from(2);
        }
    };
    match backup(&url, target) {
        Ok(report) => {
            println!(
                "backed up {} to {}: {} conversations, {} messages, {} bytes (integrity check ok)",
                url.shown(),
                report.path.display(),
                report.conversations,
                report.messages,
                report.bytes
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("lull: {}", redact(e.to_string()));
            ExitCode::FAILURE
        }
    }
}

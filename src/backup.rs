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
    if let Some(missing) = missing_folder(target) {
        eprintln!(
            "lull: cannot back up to {}: the folder {} does not exist (create it first: mkdir -p {})",
            target.display(),
            missing.display(),
            missing.display()
        );
        return ExitCode::FAILURE;
    }
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

/// The folder `target` would be written in, when it does not exist (a bare file name
/// is written in the current folder, which does).
fn missing_folder(target: &Path) -> Option<&Path> {
    let folder = target.parent().filter(|p| !p.as_os_str().is_empty())?;
    (!folder.is_dir()).then_some(folder)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_folder_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no/such");
        assert_eq!(
            missing_folder(&missing.join("copy.db")),
            Some(missing.as_path())
        );
        assert_eq!(missing_folder(&dir.path().join("copy.db")), None);
        assert_eq!(missing_folder(Path::new("copy.db")), None);
    }
}

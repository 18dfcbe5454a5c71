//! Statement helpers: errors with the context of the statement that failed, and
//! placeholder lists.

use rusqlite::ErrorCode;

use crate::store::StoreError;

/// Attaches what we were doing to a SQLite error and sorts out the conditions a
/// caller can wait out (busy, full) from real failures.
pub(super) trait Context<T> {
    fn ctx(self, context: &'static str) -> Result<T, StoreError>;
}

impl<T> Context<T> for Result<T, rusqlite::Error> {
    fn ctx(self, context: &'static str) -> Result<T, StoreError> {
        self.map_err(|source| classify(context, source))
    }
}

pub(super) fn classify(context: &'static str, source: rusqlite::Error) -> StoreError {
    match source.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => StoreError::Busy,
        Some(ErrorCode::DiskFull) => StoreError::Full,
        Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => {
            StoreError::Damaged(format!("{source}, while {context}"))
        }
        Some(
            ErrorCode::SystemIoFailure
            | ErrorCode::ReadOnly
            | ErrorCode::CannotOpen
            | ErrorCode::PermissionDenied,
        ) => StoreError::Io(format!("{source}, while {context}")),
        _ => StoreError::Backend {
            context,
            message: source.to_string(),
        },
    }
}

/// `?N, ?N+1, …` placeholders for an IN list starting at parameter `first`.
pub(super) fn placeholders(first: usize, count: usize) -> String {
    (first..first + count)
        .map(|i| format!("?{i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

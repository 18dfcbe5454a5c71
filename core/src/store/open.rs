//! Opening the store a `DATABASE_URL` names, and the counter-test's switch.

use lull_port::secrets::redact_url as redacted_url;

use super::{PostgresStore, SqliteStore, Store, StoreError, TimeSource};
use crate::timing::TimerPolicy;

/// Where the store lives, from `DATABASE_URL`.
#[derive(Clone)]
pub enum DatabaseUrl {
    /// `sqlite:PATH` (also `sqlite://PATH`): one file, for processes on one host.
    Sqlite(std::path::PathBuf),
    /// `postgres://…` or `postgresql://…`: one database for replicas on several hosts.
    /// Kept whole (it may carry a password); shown only through [`DatabaseUrl::shown`].
    Postgres(secrecy::SecretString),
}

impl DatabaseUrl {
    /// Read a `DATABASE_URL`; anything but `sqlite:PATH`, `postgres://…` or
    /// `postgresql://…` is refused with a message naming the variable.
    pub fn parse(url: &str) -> Result<Self, String> {
        let url = url.trim();
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let parsed = url::Url::parse(url).map_err(|e| {
                format!(
                    "DATABASE_URL is not a valid PostgreSQL URL ({e}): {}",
                    redacted_url(url)
                )
            })?;
            if parsed.host_str().is_none_or(str::is_empty) {
                return Err(format!(
                    "DATABASE_URL must name the PostgreSQL host, got {}",
                    redacted_url(url)
                ));
            }
            // The driver's own reading (parameters such as `sslmode`), checked at start.
            <tokio_postgres::Config as std::str::FromStr>::from_str(url).map_err(|e| {
                format!(
                    "DATABASE_URL is not a valid PostgreSQL URL ({e}): {}",
                    redacted_url(url)
                )
            })?;
            return Ok(DatabaseUrl::Postgres(url.to_owned().into()));
        }
        let path = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
            .ok_or_else(|| {
                format!(
                    "DATABASE_URL must be sqlite:PATH (for example sqlite:lull.db) or postgres://…, got '{}'",
                    redacted_url(url)
                )
            })?;
        if path.is_empty() || path.starts_with(':') {
            return Err(format!(
                "DATABASE_URL must name a database file (sqlite:PATH), got '{url}'"
            ));
        }
        Ok(DatabaseUrl::Sqlite(path.into()))
    }

    /// The PostgreSQL password, if the URL carries one: registered for redaction
    /// (`lull_port::secrets`) before anything logs. It is the password as the driver
    /// reads it and sends it to the server, from the user info or a `password=`
    /// parameter: percent-decoded (`%40` is `@`), and nothing else. Not form-decoded:
    /// a URL's user info is no form, so `+`, `=` and `&` are themselves (a form
    /// decoder makes `+` a space and cuts at `=` or `&`, and the real password would
    /// then be logged unredacted).
    pub fn password(&self) -> Option<secrecy::SecretString> {
        let DatabaseUrl::Postgres(url) = self else {
            return None;
        };
        let config = <tokio_postgres::Config as std::str::FromStr>::from_str(
            secrecy::ExposeSecret::expose_secret(url),
        )
        .ok()?;
        let password = config.get_password().filter(|p| !p.is_empty())?;
        Some(String::from_utf8_lossy(password).into_owned().into())
    }

    /// The URL as it may be shown: no credentials, no query.
    pub fn shown(&self) -> String {
        match self {
            DatabaseUrl::Sqlite(path) => path.display().to_string(),
            DatabaseUrl::Postgres(url) => redacted_url(secrecy::ExposeSecret::expose_secret(url)),
        }
    }
}

impl std::fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown())
    }
}

/// Open the store at `url` (creating and migrating it if needed), as a `lull run` or
/// `lull chat` process uses it; its timers are armed by `timers`. On PostgreSQL every
/// deadline is kept on the database's clock ([`TimeSource::Database`]); on SQLite
/// every process is on one host and shares its clock.
///
/// In builds with the `test-switches` feature (tests only), `LULL_TEST_DISABLE_LEASE=1`
/// opens it with leases that exclude no one (each process claims private lease rows,
/// see `LeaseRows`): the counter-test's switch.
pub async fn open(
    url: &DatabaseUrl,
    timers: TimerPolicy,
) -> Result<std::sync::Arc<dyn Store>, StoreError> {
    Ok(match url {
        DatabaseUrl::Sqlite(path) => std::sync::Arc::new(counter_test_switch(
            SqliteStore::open(path, timers)?,
            #[cfg(feature = "test-switches")]
            SqliteStore::without_lease_checks,
        )),
        DatabaseUrl::Postgres(url) => std::sync::Arc::new(counter_test_switch(
            PostgresStore::open(
                secrecy::ExposeSecret::expose_secret(url),
                timers,
                TimeSource::Database,
            )
            .await?,
            #[cfg(feature = "test-switches")]
            PostgresStore::without_lease_checks,
        )),
    })
}

/// The counter-test's switch, read from the environment (`LULL_TEST_DISABLE_LEASE=1`)
/// in builds with the `test-switches` feature: `without_lease_checks` applied to the
/// store; the store unchanged in every other build.
fn counter_test_switch<S>(
    store: S,
    #[cfg(feature = "test-switches")] without_lease_checks: fn(S) -> S,
) -> S {
    #[cfg(feature = "test-switches")]
    if std::env::var("LULL_TEST_DISABLE_LEASE").is_ok_and(|v| v == "1") {
        tracing::warn!(
            "LULL_TEST_DISABLE_LEASE=1: lease checks are OFF (counter-test build); replies may be duplicated"
        );
        return without_lease_checks(store);
    }
    store
}

#[cfg(test)]
mod tests {
    use super::DatabaseUrl;
    use secrecy::ExposeSecret;

    #[test]
    fn database_urls_name_a_backend_or_fail_naming_the_variable() {
        assert!(matches!(
            DatabaseUrl::parse("sqlite:data/lull.db"),
            Ok(DatabaseUrl::Sqlite(path)) if path == std::path::Path::new("data/lull.db")
        ));
        for url in [
            "postgres://lull:s%40cret@db.internal:5432/lull?sslmode=require",
            "postgresql://db.internal/lull",
        ] {
            assert!(
                matches!(DatabaseUrl::parse(url), Ok(DatabaseUrl::Postgres(_))),
                "{url}"
            );
        }
        for bad in [
            "mysql://x/y",
            "postgres://",
            "postgres://db/lull?sslmode=sometimes",
            "lull.db",
            "sqlite:",
            "",
        ] {
            let error = DatabaseUrl::parse(bad).unwrap_err();
            assert!(error.contains("DATABASE_URL"), "{bad}: {error}");
        }
    }

    #[test]
    fn a_postgres_password_is_never_shown_and_is_known_for_redaction() {
        let url =
            DatabaseUrl::parse("postgres://lull:s%40cret@db.internal:5432/lull?sslmode=require")
                .unwrap();
        assert!(!url.shown().contains("cret"), "{}", url.shown());
        assert!(!format!("{url:?}").contains("cret"));
        assert_eq!(url.password().unwrap().expose_secret(), "s@cret");
        // Percent-decoded and nothing else: `+`, `=` and `&` are themselves.
        for (url, password) in [
            ("postgres://lull:a+b=c&d%40e%2B@db/lull", "a+b=c&d@e+"),
            ("postgres://lull:%2B%3D%26@db/lull", "+=&"),
            ("postgres://lull@db/lull?password=p%26q+r", "p&q+r"),
        ] {
            let found = DatabaseUrl::parse(url).unwrap().password();
            assert_eq!(
                found.as_ref().map(ExposeSecret::expose_secret),
                Some(password),
                "{url}"
            );
        }
        assert!(
            DatabaseUrl::parse("postgres://db/lull")
                .unwrap()
                .password()
                .is_none()
        );
    }
}

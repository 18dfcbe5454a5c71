//! The status page's login: the cookie the form sets, and how fast the form may be
//! guessed at.
//!
//! The cookie is a session that expires: `EXPIRES.MAC`, where `EXPIRES` is its end in
//! milliseconds since the Unix epoch and `MAC` the hex HMAC-SHA256 of it under a key
//! derived from `LULL_HTTP_TOKEN`. It holds no secret, cannot be extended or forged
//! without the token, stops working at its end (whatever the browser keeps), and every
//! session ends when the token changes. `POST /logout` ends one sooner: the browser's
//! cookie is cleared and the session is refused by this process until its end
//! ([`Sessions::revoke`]; a copy of the cookie still opens another replica's console
//! until then, as after a restart: change the token to end every session at once).
//!
//! Wrong tokens are counted for the whole process: after [`MAX_FAILURES`] in
//! [`FAILURE_WINDOW`], `POST /login` answers 429 until the window has room again. Per
//! process rather than per address: behind a reverse proxy every request comes from
//! the proxy's address, and a per-address limit would be one forwarded header away from
//! useless.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};

use lull_core::domain::Timestamp;

/// How long a login lasts.
pub(super) const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// Wrong tokens allowed per [`FAILURE_WINDOW`].
pub(super) const MAX_FAILURES: usize = 10;
/// The window [`MAX_FAILURES`] counts in.
pub(super) const FAILURE_WINDOW: Duration = Duration::from_secs(60);

/// Issues and checks login sessions for one token (module docs).
#[derive(Clone)]
pub(crate) struct Sessions {
    /// The HMAC key: SHA-256 of a label and the token (never the token itself).
    key: [u8; 32],
    /// Sessions logged out in this process, each with its end (dropped once past it:
    /// it is refused then anyway). Only valid sessions enter, so its size is bounded
    /// by the logins.
    revoked: Arc<Mutex<HashMap<String, i64>>>,
}

impl Sessions {
    pub(crate) fn new(token: &SecretString) -> Sessions {
        let mut hash = Sha256::new();
        hash.update(b"lull status page session\0");
        hash.update(token.expose_secret().as_bytes());
        Sessions {
            key: hash.finalize().into(),
            revoked: Arc::default(),
        }
    }

    fn mac(&self, expires: i64) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("any key length");
        mac.update(expires.to_string().as_bytes());
        mac.finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// A session starting at `now`: the cookie's value.
    pub(crate) fn issue(&self, now: Timestamp) -> String {
        let expires = now.plus(SESSION_LIFETIME).0;
        format!("{expires}.{}", self.mac(expires))
    }

    /// Whether `value` is a session of this token still open at `now` (its MAC compared
    /// in constant time).
    pub(crate) fn valid(&self, value: &str, now: Timestamp) -> bool {
        let Some((expires, mac)) = value.split_once('.') else {
            return false;
        };
        let Ok(expires) = expires.parse::<i64>() else {
            return false;
        };
        lull_adapters::http::same_secret(mac.as_bytes(), self.mac(expires).as_bytes())
            && expires > now.0
            && !self.revoked().contains_key(value)
    }

    /// End the session `value` now (a logout), if it is one of this token's and open:
    /// from now on [`Sessions::valid`] refuses it in this process.
    pub(crate) fn revoke(&self, value: &str, now: Timestamp) {
        if !self.valid(value, now) {
            return;
        }
        let Some(expires) = value.split_once('.').and_then(|(e, _)| e.parse().ok()) else {
            return;
        };
        let mut revoked = self.revoked();
        revoked.retain(|_, end| *end > now.0);
        revoked.insert(value.to_owned(), expires);
    }

    fn revoked(&self) -> std::sync::MutexGuard<'_, HashMap<String, i64>> {
        self.revoked.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Wrong tokens given to the login form lately (module docs).
#[derive(Debug, Default)]
pub(super) struct Failures {
    /// Why a std mutex: held for a few pushes and pops, never across an await.
    at: Mutex<VecDeque<Instant>>,
}

impl Failures {
    /// `Err(wait)`: the form takes no more tries for `wait`.
    pub(super) fn check(&self, now: Instant) -> Result<(), Duration> {
        let mut at = self.at.lock().expect("not poisoned");
        while at
            .front()
            .is_some_and(|t| now.duration_since(*t) >= FAILURE_WINDOW)
        {
            at.pop_front();
        }
        match at.front() {
            Some(oldest) if at.len() >= MAX_FAILURES => {
                Err(FAILURE_WINDOW.saturating_sub(now.duration_since(*oldest)))
            }
            _ => Ok(()),
        }
    }

    /// Count a wrong token given at `now`.
    pub(super) fn record(&self, now: Instant) {
        self.at.lock().expect("not poisoned").push_back(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_expires_and_belongs_to_its_token() {
        let sessions = Sessions::new(&SecretString::from("s3cret"));
        let now = Timestamp(1_700_000_000_000);
        let cookie = sessions.issue(now);
        assert!(!cookie.contains("s3cret"));
        assert!(sessions.valid(&cookie, now.plus(SESSION_LIFETIME / 2)));
        assert!(
            !sessions.valid(&cookie, now.plus(SESSION_LIFETIME)),
            "expired"
        );
        let other = Sessions::new(&SecretString::from("other"));
        assert!(!other.valid(&cookie, now), "another token's");
        // Extending the end without the token breaks the MAC.
        let (_, mac) = cookie.split_once('.').unwrap();
        let later = now.plus(SESSION_LIFETIME * 10).0;
        assert!(!sessions.valid(&format!("{later}.{mac}"), now));
        assert!(!sessions.valid("garbage", now));
    }

    #[test]
    fn a_logged_out_session_is_refused_until_its_end() {
        let sessions = Sessions::new(&SecretString::from("s3cret"));
        let now = Timestamp(1_700_000_000_000);
        let (one, two) = (sessions.issue(now), sessions.issue(Timestamp(now.0 + 1)));
        sessions.revoke(&one, Timestamp(now.0 + 5));
        assert!(!sessions.valid(&one, Timestamp(now.0 + 6)), "logged out");
        assert!(
            sessions.valid(&two, Timestamp(now.0 + 6)),
            "another login stays"
        );
        sessions.revoke("garbage.00", now);
        assert_eq!(sessions.revoked().len(), 1, "only sessions enter");
        // Past its end it is dropped at the next logout (it is refused anyway).
        let end = Timestamp(now.plus(SESSION_LIFETIME).0 + 2);
        let three = sessions.issue(end);
        sessions.revoke(&three, end);
        assert_eq!(sessions.revoked().len(), 1);
    }

    #[test]
    fn wrong_tokens_are_limited_per_window() {
        let failures = Failures::default();
        let start = Instant::now();
        for n in 0..MAX_FAILURES {
            assert!(failures.check(start).is_ok(), "try {n}");
            failures.record(start);
        }
        let wait = failures.check(start + Duration::from_secs(10)).unwrap_err();
        assert_eq!(wait, FAILURE_WINDOW - Duration::from_secs(10));
        assert!(failures.check(start + FAILURE_WINDOW).is_ok(), "room again");
    }
}

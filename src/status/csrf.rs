//! The console's forms against cross-site request forgery: a double-submit token.
//!
//! Every console page makes sure the browser holds a random token in the cookie
//! [`CSRF_COOKIE`] (`HttpOnly`, `SameSite=Strict`, `Secure` behind a proxy that says
//! HTTPS) and puts the same token in a hidden `csrf` field of each of its forms. A
//! change is made only when the posted field equals the cookie (compared in constant
//! time). Another site can make a browser post a form here, but it can neither read
//! the token nor, `SameSite=Strict`, have the browser send the cookie with its post:
//! the forged change is refused (403), with or without a login. This holds with the
//! console open on loopback too, where a page on the internet could otherwise reach
//! `127.0.0.1` through the operator's browser.

use axum::http::{HeaderMap, HeaderValue};

/// The cookie holding the form token.
pub(super) const CSRF_COOKIE: &str = "lull_csrf";

/// A new form token: 128 random bits from the operating system, in hex.
pub(super) fn new_token() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the operating system gives random bytes");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The form token the browser holds, if any (a well-formed one: 32 hex digits).
pub(super) fn from_cookie(headers: &HeaderMap) -> Option<String> {
    super::cookies(headers, CSRF_COOKIE)
        .into_iter()
        .find(|value| value.len() == 32 && value.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The `Set-Cookie` value that gives the browser `token`.
pub(super) fn set_cookie(token: &str, secure: bool) -> Option<HeaderValue> {
    super::set_cookie(CSRF_COOKIE, token, None, secure)
}

/// Whether a posted form's `csrf` field is the token of the browser that posted it.
pub(super) fn checked(headers: &HeaderMap, posted: Option<&str>) -> bool {
    match (from_cookie(headers), posted) {
        (Some(cookie), Some(posted)) => super::same_secret(posted.as_bytes(), cookie.as_bytes()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::header;

    fn with_cookie(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("other=1; {CSRF_COOKIE}={value}")).unwrap(),
        );
        headers
    }

    #[test]
    fn only_the_browsers_own_token_passes() {
        let token = new_token();
        assert_eq!(token.len(), 32);
        assert_ne!(token, new_token(), "random");
        let headers = with_cookie(&token);
        assert_eq!(from_cookie(&headers).as_deref(), Some(token.as_str()));
        assert!(checked(&headers, Some(&token)));
        assert!(!checked(&headers, Some(&new_token())), "another token");
        assert!(!checked(&headers, None), "no field");
        assert!(!checked(&HeaderMap::new(), Some(&token)), "no cookie");
        assert!(
            !checked(&with_cookie("x"), Some("x")),
            "not a token of ours"
        );
    }
}

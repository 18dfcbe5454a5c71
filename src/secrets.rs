//! Keeping secrets out of logs and error messages.
//!
//! Bot tokens hide inside request URLs (Telegram puts the token in every Bot API
//! path) and in headers a library may quote in an error (Discord's `Authorization:
//! Bot …`). Every text that may carry one passes a [`Redactor`] before it is logged,
//! stored or shown.

use std::fmt;

use secrecy::{ExposeSecret, SecretString};

/// What replaces a secret.
pub const REDACTED: &str = "<redacted>";

/// Removes one secret, in any form it is likely to appear, from texts.
#[derive(Clone)]
pub struct Redactor {
    secret: SecretString,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Redactor(..)")
    }
}

impl Redactor {
    /// A redactor for `secret`; a `Bot ` prefix pasted along with a Discord token is
    /// ignored.
    pub fn new(secret: &SecretString) -> Self {
        let trimmed = secret.expose_secret().trim();
        let bare = trimmed.strip_prefix("Bot ").unwrap_or(trimmed);
        Self {
            secret: SecretString::from(bare),
        }
    }

    /// `text` with every occurrence of the secret replaced: as is, percent-encoded,
    /// and (for `id:secret` tokens such as Telegram's) the part after the colon alone,
    /// in case an error quotes only a piece of a URL.
    pub fn redact(&self, text: impl fmt::Display) -> String {
        let text = text.to_string();
        let secret = self.secret.expose_secret();
        if secret.is_empty() {
            return text;
        }
        let mut out = text.replace(secret, REDACTED);
        for encoded in [secret.replace(':', "%3A"), secret.replace(':', "%3a")] {
            if encoded != secret {
                out = out.replace(&encoded, REDACTED);
            }
        }
        if let Some((_, tail)) = secret.rsplit_once(':')
            && tail.len() >= 8
        {
            out = out.replace(tail, REDACTED);
        }
        out
    }

    /// An error and its sources on one line, redacted.
    pub fn error(&self, error: &(dyn std::error::Error + 'static)) -> String {
        let mut text = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            let cause_text = cause.to_string();
            if !text.contains(&cause_text) {
                text.push_str(": ");
                text.push_str(&cause_text);
            }
            source = cause.source();
        }
        self.redact(&text)
    }
}

/// A URL without its query, fragment and credentials (they may carry secrets).
pub fn redact_url(url: &str) -> String {
    let without_query = url.split(['?', '#']).next().unwrap_or(url);
    match without_query.split_once("://") {
        Some((scheme, rest)) => match rest.split_once('@') {
            Some((_, host)) => format!("{scheme}://{REDACTED}@{host}"),
            None => without_query.to_owned(),
        },
        None => without_query.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TELEGRAM: &str = "123456:AAHsecretSECRETsecret";

    #[test]
    fn a_telegram_token_is_redacted_in_any_form() {
        let r = Redactor::new(&SecretString::from(TELEGRAM));
        let text = format!(
            "error sending request for url (http://127.0.0.1:1/bot{TELEGRAM}/GetUpdates) / bot123456%3AAAHsecretSECRETsecret / AAHsecretSECRETsecret"
        );
        let redacted = r.redact(&text);
        assert!(!redacted.contains("AAHsecretSECRETsecret"), "{redacted}");
        assert!(redacted.contains("/bot<redacted>/GetUpdates"), "{redacted}");
        assert!(!format!("{r:?}").contains("secret"));
    }

    #[test]
    fn a_discord_token_is_redacted_wherever_it_appears() {
        let redactor = Redactor::new(&SecretString::from("abc.def.ghi"));
        assert_eq!(
            redactor.redact("Authorization: Bot abc.def.ghi; url=/x?t=abc.def.ghi"),
            "Authorization: Bot <redacted>; url=/x?t=<redacted>"
        );
        let prefixed = Redactor::new(&SecretString::from("Bot abc.def.ghi"));
        assert_eq!(prefixed.redact("abc.def.ghi"), "<redacted>");
    }

    #[test]
    fn urls_lose_credentials_and_queries() {
        assert_eq!(
            redact_url("https://user:pw@host/x?key=1"),
            "https://<redacted>@host/x"
        );
        assert_eq!(
            redact_url("http://127.0.0.1:9/replies"),
            "http://127.0.0.1:9/replies"
        );
    }
}

//! Keeping secrets out of logs, errors, the database and messages to users.
//!
//! Bot tokens hide inside request URLs (Telegram puts the token in every Bot API
//! path), in headers a library may quote in an error (Discord's `Authorization:
//! Bot …`), and in error bodies a model server or proxy echoes back (`Incorrect API
//! key provided: sk-…`). Every text that may carry one passes a [`Redactor`] before it
//! is logged, stored or shown.
//!
//! Invariant: once a secret is [`register`]ed, [`redact`] removes it from any text,
//! and the binary's log writer passes every formatted event through
//! [`redact`], so no log line carries a registered secret even if a boundary forgot to
//! redact. The binary registers every configured secret
//! (its `Settings::secrets`) before anything logs.

use std::fmt;
use std::sync::RwLock;

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
        // A Standard Webhooks secret (`whsec_<base64 key>`): the key alone too.
        if let Some(key) = secret.strip_prefix("whsec_")
            && key.len() >= 8
        {
            out = out.replace(key, REDACTED);
        }
        out
    }

    /// An error and its sources on one line, redacted.
    pub fn error(&self, error: &(dyn std::error::Error + 'static)) -> String {
        self.redact(chain(error))
    }

    fn is(&self, secret: &str) -> bool {
        self.secret.expose_secret() == secret
    }

    /// Where a tail of `text` that could be the start of the secret begins (at least
    /// [`MIN_SECRET_CHARS`] of it, as is or the part after an `id:` colon), if any.
    fn unfinished_at(&self, text: &str) -> Option<usize> {
        let secret = self.secret.expose_secret();
        let tail = secret.rsplit_once(':').map(|(_, tail)| tail);
        [Some(secret), tail.filter(|t| t.len() >= 8)]
            .into_iter()
            .flatten()
            .filter_map(|form| {
                form.char_indices()
                    .map(|(i, c)| i + c.len_utf8())
                    .filter(|&end| end >= MIN_SECRET_CHARS && end < form.len())
                    .filter(|&end| text.ends_with(&form[..end]))
                    .max()
                    .map(|end| text.len() - end)
            })
            .min()
    }
}

/// An error and its sources on one line (`outer: cause: root cause`), a cause left out
/// when the text already quotes it. Not redacted: see [`redact_error`].
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
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
    text
}

/// Secrets shorter than this are not registered: redacting every `ab` would garble
/// logs while hiding nothing a guess would not find.
const MIN_SECRET_CHARS: usize = 4;

/// Every secret registered in this process. A std lock: held to read or push a few
/// redactors, never across an await.
static REGISTERED: RwLock<Vec<Redactor>> = RwLock::new(Vec::new());

/// Register a secret for the process-wide redaction: from now on [`redact`] removes
/// it from every text, and no log line carries it. Registering one twice is harmless.
pub fn register(secret: &SecretString) {
    let redactor = Redactor::new(secret);
    let bare = redactor.secret.expose_secret();
    if bare.chars().count() < MIN_SECRET_CHARS {
        return;
    }
    let mut registered = REGISTERED.write().unwrap_or_else(|e| e.into_inner());
    if !registered.iter().any(|r| r.is(bare)) {
        registered.push(redactor);
    }
}

/// `text` without any registered secret (see [`register`]).
pub fn redact(text: impl fmt::Display) -> String {
    let registered = REGISTERED.read().unwrap_or_else(|e| e.into_inner());
    registered
        .iter()
        .fold(text.to_string(), |text, redactor| redactor.redact(text))
}

/// A text still being written (a reply shown as a live draft) without any registered
/// secret, and without a tail that may be the start of one: the rest of a key may be
/// in the next words, where [`redact`] would only find it then.
pub fn redact_growing(text: impl fmt::Display) -> String {
    let mut text = redact(text);
    let registered = REGISTERED.read().unwrap_or_else(|e| e.into_inner());
    if let Some(at) = registered
        .iter()
        .filter_map(|r| r.unfinished_at(&text))
        .min()
    {
        text.truncate(at);
    }
    text
}

/// An error and its sources on one line, without any registered secret.
pub fn redact_error(error: &(dyn std::error::Error + 'static)) -> String {
    redact(chain(error))
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
    fn a_webhook_secret_is_redacted_with_or_without_its_prefix() {
        let r = Redactor::new(&SecretString::from(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        ));
        assert_eq!(
            r.redact("a whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw b MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            "a <redacted> b <redacted>"
        );
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
    fn registered_secrets_are_redacted_everywhere_and_short_ones_ignored() {
        register(&SecretString::from("sk-registered-key-1"));
        register(&SecretString::from("sk-registered-key-1"));
        register(&SecretString::from("Bot disc.ord.token"));
        register(&SecretString::from("abc"));
        assert_eq!(
            redact("Bearer sk-registered-key-1 / Bot disc.ord.token / abc"),
            "Bearer <redacted> / Bot <redacted> / abc"
        );
        let registered = REGISTERED.read().unwrap();
        let copies = registered
            .iter()
            .filter(|r| r.is("sk-registered-key-1"))
            .count();
        assert_eq!(copies, 1);
    }

    #[test]
    fn a_growing_text_never_shows_the_start_of_a_secret() {
        register(&SecretString::from("sk-growing-key-0123456789"));
        assert_eq!(redact_growing("the key is sk-gro"), "the key is ");
        assert_eq!(
            redact_growing("the key is sk-growing-key-012"),
            "the key is "
        );
        assert_eq!(
            redact_growing("the key is sk-growing-key-0123456789 and"),
            "the key is <redacted> and"
        );
        // Three characters could start anything: they stay.
        assert_eq!(redact_growing("ask"), "ask");
        assert_eq!(redact_growing("plain text"), "plain text");
    }

    #[test]
    fn error_chains_keep_their_causes() {
        #[derive(Debug, thiserror::Error)]
        #[error("cannot reach the server")]
        struct Outer(#[source] std::io::Error);
        let error = Outer(std::io::Error::other("connection refused"));
        assert_eq!(chain(&error), "cannot reach the server: connection refused");
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

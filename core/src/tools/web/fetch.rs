//! `lull__fetch`: one page of the public web, read so that the tool cannot be turned
//! against the host's own network (server-side request forgery).
//!
//! - Only `http` and `https`. A host written as an address is judged by the address
//!   (`address::refusal`), before any connection; a name is resolved once, by
//!   [`GuardedResolver`], which hands the connector only the addresses it checked — the
//!   connection goes to one of those, so a second lookup (DNS rebinding) never happens.
//! - Every redirect (at most [`MAX_REDIRECTS`]) is judged the same way before it is
//!   followed; no proxy from the environment is used (a proxy would resolve the name
//!   itself).
//! - At most `timeout` in all and [`MAX_BYTES`] read (more is cut, and the result says
//!   so); HTML reduced to readable text (no script, no style); other text as it is; a
//!   body that is not text (a PDF, an image) described, never dumped.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use url::{Host, Url};

use super::address;

/// Redirects followed at most.
pub const MAX_REDIRECTS: usize = 5;
/// Bytes of a body read at most.
pub const MAX_BYTES: usize = 2 * 1024 * 1024;
/// A fetch's deadline, connection to last byte.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// Why a URL was not fetched, or what went wrong fetching it: told to the model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FetchError {
    #[error("refused: {0}")]
    Refused(String),
    #[error("the page did not answer within {0:?}")]
    Timeout(Duration),
    #[error("could not fetch it: {0}")]
    Failed(String),
}

/// A page as the model reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Page {
    /// The URL after redirects.
    pub(crate) url: String,
    pub(crate) status: u16,
    pub(crate) content_type: String,
    pub(crate) text: String,
    /// The body was longer than [`MAX_BYTES`]: only its start was read.
    pub(crate) cut: bool,
}

/// The guarded client.
pub(crate) struct Fetcher {
    client: reqwest::Client,
    allow: Arc<Vec<IpNet>>,
    timeout: Duration,
}

impl Fetcher {
    /// A fetcher that lets `allow` (`LULL_FETCH_ALLOW`) through besides public
    /// addresses.
    pub(crate) fn new(allow: Vec<IpNet>, timeout: Duration) -> Result<Fetcher, String> {
        let allow = Arc::new(allow);
        let hops = allow.clone();
        let redirect = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= MAX_REDIRECTS {
                let why = format!("more than {MAX_REDIRECTS} redirects");
                return attempt.error(FetchError::Refused(why));
            }
            match check(attempt.url(), &hops) {
                Ok(()) => attempt.follow(),
                Err(why) => {
                    let why = format!("a redirect to {}: {why}", attempt.url());
                    attempt.error(FetchError::Refused(why))
                }
            }
        });
        let client = reqwest::Client::builder()
            .no_proxy()
            .redirect(redirect)
            .dns_resolver(Arc::new(GuardedResolver {
                allow: allow.clone(),
            }))
            .connect_timeout(timeout)
            .timeout(timeout)
            .user_agent(concat!(
                "lull/",
                env!("CARGO_PKG_VERSION"),
                " (lull__fetch)"
            ))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Fetcher {
            client,
            allow,
            timeout,
        })
    }

    /// Fetch `url` as a [`Page`], or say why not.
    pub(crate) async fn fetch(&self, url: &str) -> Result<Page, FetchError> {
        let url =
            Url::parse(url.trim()).map_err(|e| FetchError::Refused(format!("not a URL ({e})")))?;
        check(&url, &self.allow).map_err(FetchError::Refused)?;
        let read = async {
            let mut response = self.client.get(url).send().await.map_err(|e| self.why(e))?;
            let status = response.status().as_u16();
            let final_url = response.url().to_string();
            let content_type = response
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            let mut body = Vec::new();
            let mut cut = false;
            while let Some(chunk) = response.chunk().await.map_err(|e| self.why(e))? {
                let room = MAX_BYTES - body.len();
                if chunk.len() > room {
                    body.extend_from_slice(&chunk[..room]);
                    cut = true;
                    break;
                }
                body.extend_from_slice(&chunk);
            }
            Ok(Page {
                url: final_url,
                status,
                text: readable(&content_type, &body),
                content_type,
                cut,
            })
        };
        match tokio::time::timeout(self.timeout, read).await {
            Ok(page) => page,
            Err(_) => Err(FetchError::Timeout(self.timeout)),
        }
    }

    /// What a transport error says: the refusal a redirect or the resolver made, a
    /// timeout, or the failure (without the URL's query, which may carry a secret).
    fn why(&self, error: reqwest::Error) -> FetchError {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&error);
        while let Some(e) = source {
            if let Some(refused) = e.downcast_ref::<FetchError>() {
                return refused.clone();
            }
            if let Some(refused) = e.downcast_ref::<Unresolvable>() {
                return FetchError::Refused(refused.0.clone());
            }
            source = e.source();
        }
        if error.is_timeout() {
            return FetchError::Timeout(self.timeout);
        }
        let text = error.without_url().to_string();
        FetchError::Failed(lull_port::secrets::redact(text))
    }
}

/// Judge a URL before it is asked: its scheme, and its host when written as an
/// address (a name is judged by the resolver, on the addresses it finds).
fn check(url: &Url, allow: &[IpNet]) -> Result<(), String> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "only http and https pages are fetched, not {}:",
            url.scheme()
        ));
    }
    let ip: IpAddr = match url.host() {
        None => return Err("the URL names no host".into()),
        Some(Host::Domain(_)) => return Ok(()),
        Some(Host::Ipv4(v4)) => v4.into(),
        Some(Host::Ipv6(v6)) => v6.into(),
    };
    match address::refusal(ip, allow) {
        Some(why) => Err(format!("{ip} is {why}")),
        None => Ok(()),
    }
}

/// A name that resolved to no address lull may fetch.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Unresolvable(String);

/// The resolver of the fetch client: the system's lookup, keeping only the addresses
/// [`address::refusal`] lets through; a name with none left is refused. The connector
/// connects to what this returns, so the address checked is the address used.
struct GuardedResolver {
    allow: Arc<Vec<IpNet>>,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let allow = self.allow.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let found = lookup(&host).await?;
            let mut kept = Vec::new();
            let mut refused = None;
            for addr in found {
                match address::refusal(addr.ip(), &allow) {
                    None => kept.push(addr),
                    Some(why) => {
                        refused =
                            refused.or(Some(format!("{host} resolves to {}, {why}", addr.ip())))
                    }
                }
            }
            if kept.is_empty() {
                let why = refused.unwrap_or_else(|| format!("{host} resolves to no address"));
                return Err(Box::new(Unresolvable(why)) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(kept.into_iter()) as Addrs)
        })
    }
}

/// The addresses of `host` (port 0: the connector sets the URL's): the test build's
/// fixed answers first (`LULL_TEST_RESOLVE`), then the system's resolver.
async fn lookup(host: &str) -> Result<Vec<SocketAddr>, Box<dyn std::error::Error + Send + Sync>> {
    if let Some(ip) = crate::switches::test_resolve(host) {
        return Ok(vec![SocketAddr::new(ip, 0)]);
    }
    let found = tokio::net::lookup_host((host, 0)).await.map_err(|e| {
        Box::new(Unresolvable(format!("{host} could not be resolved ({e})")))
            as Box<dyn std::error::Error + Send + Sync>
    })?;
    Ok(found.collect())
}

/// The body as the model reads it: HTML as readable text (scripts and styles
/// dropped), other text as it is, anything else described.
fn readable(content_type: &str, body: &[u8]) -> String {
    let kind = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let looks_html = kind.is_empty() && body.iter().take(512).any(|b| *b == b'<');
    if kind == "text/html" || kind == "application/xhtml+xml" || looks_html {
        return html_text(body);
    }
    let textual = kind.starts_with("text/")
        || kind.ends_with("json")
        || kind.ends_with("xml")
        || kind.is_empty() && std::str::from_utf8(body).is_ok();
    if textual {
        return String::from_utf8_lossy(body).into_owned();
    }
    format!(
        "[not text: {}, {} bytes, not shown]",
        if kind.is_empty() { "binary" } else { &kind },
        body.len()
    )
}

/// HTML reduced to text: the document's words, its links as footnotes, no script or
/// style.
fn html_text(body: &[u8]) -> String {
    match html2text::from_read(body, 100) {
        Ok(text) => text,
        Err(e) => format!("[an HTML page that could not be read: {e}]"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_judged_by_scheme_and_address_before_any_connection() {
        let checked = |url: &str| check(&Url::parse(url).unwrap(), &[]);
        assert!(checked("https://example.com/a").is_ok());
        assert!(checked("http://93.184.216.34/").is_ok());
        for url in [
            "file:///etc/passwd",
            "ftp://example.com/",
            "gopher://example.com/",
            "http://2130706433/",
            "http://[::ffff:127.0.0.1]/",
            "http://169.254.169.254/latest/meta-data/",
        ] {
            assert!(checked(url).is_err(), "{url}");
        }
    }

    #[test]
    fn bodies_are_read_as_text_or_described() {
        let page = readable(
            "text/html; charset=utf-8",
            b"<html><head><style>p{color:red}</style><script>alert(1)</script></head><body><h1>Title</h1><p>Hello <b>there</b>.</p></body></html>",
        );
        assert!(page.contains("Title") && page.contains("Hello"), "{page}");
        assert!(
            !page.contains("alert") && !page.contains("color:red"),
            "{page}"
        );
        assert_eq!(readable("text/plain", b"just text"), "just text");
        assert!(
            readable("application/pdf", b"%PDF-1.4 ...").starts_with("[not text: application/pdf,")
        );
        assert!(readable("", &[0, 159, 146, 150]).contains("binary"));
    }
}

//! `lull__search`: a query through a self-hosted SearXNG instance's JSON API
//! (`LULL_SEARCH_URL`, `GET /search?q=…&format=json`): the titles, URLs and snippets of
//! the first results. Every failure (an error status, no answer in time, an answer
//! that is not SearXNG's JSON) is a sentence for the model, never a failed round.

use std::time::Duration;

use serde::Deserialize;
use url::Url;

/// Results shown at most.
pub(crate) const RESULTS: usize = 5;
/// Characters of one snippet shown at most.
const SNIPPET_CHARS: usize = 300;
/// Bytes of an answer read at most.
const MAX_ANSWER_BYTES: usize = 1024 * 1024;

/// The SearXNG instance and its client.
pub(crate) struct Searcher {
    client: reqwest::Client,
    endpoint: Url,
    timeout: Duration,
}

#[derive(Deserialize)]
struct Answer {
    results: Vec<Found>,
}

#[derive(Deserialize)]
struct Found {
    #[serde(default)]
    title: String,
    #[serde(default)]
    url: String,
    #[serde(default)]
    content: String,
}

impl Searcher {
    /// A searcher asking `base` (`LULL_SEARCH_URL`, the instance's address).
    pub(crate) fn new(base: &Url, timeout: Duration) -> Result<Searcher, String> {
        let endpoint = endpoint(base)?;
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .user_agent(concat!(
                "lull/",
                env!("CARGO_PKG_VERSION"),
                " (lull__search)"
            ))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Searcher {
            client,
            endpoint,
            timeout,
        })
    }

    /// The instance's search URL for `query`.
    fn url(&self, query: &str) -> Url {
        let mut url = self.endpoint.clone();
        url.query_pairs_mut()
            .append_pair("q", query)
            .append_pair("format", "json");
        url
    }

    /// The first results for `query`, as lines for the model; `Err`: why there are none.
    pub(crate) async fn search(&self, query: &str) -> Result<String, String> {
        let asked = async {
            let mut response = self
                .client
                .get(self.url(query))
                .send()
                .await
                .map_err(|e| self.why(e))?;
            let status = response.status();
            let mut body = Vec::new();
            while let Some(chunk) = response.chunk().await.map_err(|e| self.why(e))? {
                body.extend_from_slice(&chunk);
                if body.len() > MAX_ANSWER_BYTES {
                    return Err("the search answer was too large".to_owned());
                }
            }
            if !status.is_success() {
                return Err(format!("the search service answered {status}"));
            }
            let answer: Answer = serde_json::from_slice(&body)
                .map_err(|e| format!("the search service's answer was not its JSON ({e})"))?;
            Ok(lines(query, &answer.results))
        };
        match tokio::time::timeout(self.timeout, asked).await {
            Ok(found) => found,
            Err(_) => Err(format!(
                "the search service did not answer within {:?}",
                self.timeout
            )),
        }
    }

    /// Whether the instance answers a query with its JSON (`lull check`).
    pub(crate) async fn probe(&self) -> Result<(), String> {
        self.search("lull").await.map(|_| ())
    }

    fn why(&self, error: reqwest::Error) -> String {
        if error.is_timeout() {
            return format!(
                "the search service did not answer within {:?}",
                self.timeout
            );
        }
        format!(
            "the search service could not be reached ({})",
            lull_port::secrets::redact(error.without_url().to_string())
        )
    }
}

/// `base`'s `/search` endpoint (a base with a path keeps it: `http://host/searx/`).
fn endpoint(base: &Url) -> Result<Url, String> {
    if !matches!(base.scheme(), "http" | "https") {
        return Err(format!("must be an http(s) URL, got {}:", base.scheme()));
    }
    let mut base = base.clone();
    base.set_query(None);
    if !base.path().ends_with('/') {
        let path = format!("{}/", base.path());
        base.set_path(&path);
    }
    base.join("search").map_err(|e| e.to_string())
}

fn lines(query: &str, results: &[Found]) -> String {
    if results.is_empty() {
        return format!("No results for {query:?}.");
    }
    let shown: Vec<String> = results
        .iter()
        .take(RESULTS)
        .enumerate()
        .map(|(n, r)| {
            let snippet: String = r.content.chars().take(SNIPPET_CHARS).collect();
            format!(
                "{}. {}\n{}\n{}",
                n + 1,
                r.title.trim(),
                r.url.trim(),
                snippet.trim()
            )
        })
        .collect();
    format!("Results for {query:?}:\n\n{}", shown.join("\n\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_keeps_the_base_path_and_quotes_the_query() {
        let s = Searcher::new(
            &Url::parse("http://127.0.0.1:8888/searx").unwrap(),
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(
            s.url("rust & go").as_str(),
            "http://127.0.0.1:8888/searx/search?q=rust+%26+go&format=json"
        );
        assert!(endpoint(&Url::parse("ftp://x/").unwrap()).is_err());
    }

    #[test]
    fn results_are_numbered_lines_and_bounded() {
        let found: Vec<Found> = (0..8)
            .map(|n| Found {
                title: format!("T{n}"),
                url: format!("https://e.com/{n}"),
                content: "x".repeat(1000),
            })
            .collect();
        let text = lines("q", &found);
        assert!(text.contains("5. T4") && !text.contains("6. T5"), "{text}");
        assert!(!text.contains(&"x".repeat(301)));
        assert_eq!(lines("q", &[]), "No results for \"q\".");
    }
}

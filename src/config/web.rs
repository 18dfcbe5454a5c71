//! The web tools: `lull__fetch` (`LULL_FETCH`, `LULL_FETCH_ALLOW`, `LULL_FETCH_USERS`)
//! and `lull__search` (`LULL_SEARCH_URL`), offered with `LULL_TOOLS=auto`.

use clap::Args;
use ipnet::IpNet;
use lull_core::tools::Users;
use lull_core::tools::web::{FetchSettings, TIMEOUT, WebSettings};

use super::ConfigError;

/// `LULL_FETCH`, `LULL_FETCH_ALLOW`, `LULL_FETCH_USERS`, `LULL_SEARCH_URL`.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Web tools")]
pub(crate) struct WebArgs {
    /// `on`: the model may read public web pages with `lull__fetch` (private, loopback, link-local and metadata addresses refused at every hop); `off`: not offered.
    #[arg(long, global = true, env = "LULL_FETCH", default_value = "on")]
    pub fetch: String,
    /// Address ranges `lull__fetch` may read although private or local (an intranet), comma-separated CIDRs, e.g. `10.1.0.0/16`.
    #[arg(long, global = true, env = "LULL_FETCH_ALLOW")]
    pub fetch_allow: Option<String>,
    /// Who may have `lull__fetch` run in a group: `allowed` (everyone lull answers) or `admins` (only a burst written by LULL_ADMINS).
    #[arg(
        long,
        global = true,
        env = "LULL_FETCH_USERS",
        default_value = "allowed"
    )]
    pub fetch_users: String,
    /// A SearXNG instance (its JSON API must be on: `search.formats: [html, json]`): `lull__search` is offered when set.
    #[arg(long, global = true, env = "LULL_SEARCH_URL")]
    pub search_url: Option<url::Url>,
}

impl WebArgs {
    /// The web tools' settings, `result_chars` as `LULL_TOOL_RESULT_CHARS`.
    pub(crate) fn settings(&self, result_chars: usize) -> Result<WebSettings, ConfigError> {
        let fetch = if super::on_off("LULL_FETCH", &self.fetch)? {
            Some(FetchSettings {
                allow: self.allow()?,
                users: self.users()?,
            })
        } else {
            None
        };
        if let Some(url) = &self.search_url
            && !matches!(url.scheme(), "http" | "https")
        {
            return Err(ConfigError(format!(
                "LULL_SEARCH_URL must be an http(s) URL of a SearXNG instance, got {}:",
                url.scheme()
            )));
        }
        Ok(WebSettings {
            fetch,
            search: self.search_url.clone(),
            result_chars,
            timeout: TIMEOUT,
        })
    }

    fn allow(&self) -> Result<Vec<IpNet>, ConfigError> {
        let Some(list) = &self.fetch_allow else {
            return Ok(Vec::new());
        };
        list.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|cidr| {
                cidr.parse::<IpNet>()
                    .or_else(|_| cidr.parse::<std::net::IpAddr>().map(IpNet::from))
                    .map_err(|_| {
                        ConfigError(format!(
                            "LULL_FETCH_ALLOW: {cidr:?} is not an address range (CIDR such as 10.1.0.0/16)"
                        ))
                    })
            })
            .collect()
    }

    fn users(&self) -> Result<Users, ConfigError> {
        match self.fetch_users.trim().to_ascii_lowercase().as_str() {
            "allowed" => Ok(Users::Allowed),
            "admins" => Ok(Users::Admins),
            _ => Err(ConfigError(format!(
                "LULL_FETCH_USERS must be `allowed` or `admins`, got {:?}",
                self.fetch_users
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use super::super::tests::{assert_errors_name, settings};

    #[test]
    fn fetch_is_on_search_needs_its_url_and_each_setting_is_checked() {
        let web = |args: &[&str]| Config::from_settings(&settings(args)).unwrap().web;
        let default = web(&[]).unwrap();
        assert!(default.fetch.is_some() && default.search.is_none());
        assert!(
            web(&["--tools", "off"]).is_none(),
            "LULL_TOOLS=off: no web tools"
        );
        assert!(web(&["--fetch", "off"]).unwrap().fetch.is_none());
        let tuned = web(&[
            "--fetch-allow",
            "10.1.0.0/16, 127.0.0.1",
            "--fetch-users",
            "admins",
            "--search-url",
            "http://127.0.0.1:8888",
        ])
        .unwrap();
        let fetch = tuned.fetch.unwrap();
        assert_eq!(fetch.allow.len(), 2);
        assert_eq!(fetch.users, lull_core::tools::Users::Admins);
        assert!(tuned.search.is_some());
        assert_errors_name(&[
            (&["--fetch", "maybe"], "LULL_FETCH"),
            (&["--fetch-allow", "intranet"], "LULL_FETCH_ALLOW"),
            (&["--fetch-users", "everyone"], "LULL_FETCH_USERS"),
            (&["--search-url", "ftp://x"], "LULL_SEARCH_URL"),
        ]);
    }
}

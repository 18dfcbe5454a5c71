//! What `lull check` warns of: configurations that run but are likely not what the
//! operator meant, as a newcomer writes them: a platform nobody on it may use, the
//! offline echo responder answering a real platform, replies posted back to lull
//! itself.

use lull_core::access::AccessRule;
use lull_core::domain::Platform;

use super::{Finding, warn};
use crate::config::{Config, LlmConfig};

/// Every warning of `config`, with the run-time access decisions `rules`.
pub(super) fn warnings(config: &Config, rules: &[AccessRule]) -> Vec<Finding> {
    let mut found = Vec::new();
    let platforms = [
        (Platform::Telegram, config.telegram.is_some()),
        (Platform::Discord, config.discord.is_some()),
    ];
    for (platform, _) in platforms.iter().filter(|(_, on)| *on) {
        if let Some(warning) = nobody_admitted(config, rules, *platform) {
            found.push(warn("access", warning));
        }
        if matches!(config.llm, LlmConfig::Echo(_)) {
            found.push(warn(
                "model",
                format!(
                    "the offline echo responder answers {}: people get their own words back, not a model's (set OPENAI_API_KEY, or OPENAI_BASE_URL for a local server)",
                    title(*platform)
                ),
            ));
        }
    }
    if let Some(warning) = webhook_to_itself(config, in_container()) {
        found.push(warn("http adapter", warning));
    }
    found
}

/// `platform` as people write it.
fn title(platform: Platform) -> &'static str {
    match platform {
        Platform::Telegram => "Telegram",
        Platform::Discord => "Discord",
        Platform::Http => "the http adapter",
        Platform::Console => "the console",
    }
}

/// A warning when nobody on `platform` may use the bot: no allowed user, chat or
/// admin there, and no admin's run-time `/allow` of anyone there.
fn nobody_admitted(config: &Config, rules: &[AccessRule], platform: Platform) -> Option<String> {
    let access = &config.dispatch.access;
    let admitted = access.users.names_any(platform)
        || access.chats.names_any(platform)
        || access.admins.any_on(platform)
        || rules
            .iter()
            .any(|r| r.allowed && r.subject.platform == platform);
    (!admitted).then(|| {
        format!(
            "nobody on {} can use the bot: LULL_ALLOWED_USERS, LULL_ALLOWED_CHATS and LULL_ADMINS name nobody there, so everyone who writes is told the bot is private (and their user id); add yours, e.g. LULL_ALLOWED_USERS={platform}:<your id> and LULL_ADMINS={platform}:<your id>",
            title(platform)
        )
    })
}

/// Whether this process runs in a container (Docker and Podman leave a marker file).
fn in_container() -> bool {
    std::path::Path::new("/.dockerenv").exists()
        || std::path::Path::new("/run/.containerenv").exists()
}

/// A warning when `LULL_WEBHOOK_URL` points at lull itself: a loopback address on
/// lull's own port, or (`in_container`) any loopback address, which inside a
/// container is the container, not the host.
fn webhook_to_itself(config: &Config, in_container: bool) -> Option<String> {
    let http = config.http_adapter.as_ref()?;
    let url = url::Url::parse(&http.webhook.url).ok()?;
    let loopback = match url.host()? {
        url::Host::Domain(name) => name.eq_ignore_ascii_case("localhost"),
        url::Host::Ipv4(ip) => ip.is_loopback() || ip.is_unspecified(),
        url::Host::Ipv6(ip) => ip.is_loopback() || ip.is_unspecified(),
    };
    let port = url.port_or_known_default()?;
    if loopback && port == config.http_addr.port() {
        return Some(format!(
            "LULL_WEBHOOK_URL ({}) is lull's own address (LULL_HTTP_ADDR={}): replies would be posted back to lull, not to your receiver",
            lull_port::secrets::redact_url(&http.webhook.url),
            config.http_addr
        ));
    }
    (loopback && in_container).then(|| {
        format!(
            "LULL_WEBHOOK_URL ({}) is a loopback address inside a container, which is the container itself: use the receiver's service name (compose), or host.docker.internal for a receiver on the host",
            lull_port::secrets::redact_url(&http.webhook.url)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::config_of;

    #[test]
    fn a_webhook_to_lull_itself_is_named() {
        let config = config_of(&[
            "--webhook-url",
            "http://localhost:8080/replies",
            "--http-addr",
            "127.0.0.1:8080",
        ]);
        let warning = webhook_to_itself(&config, false).unwrap();
        assert!(warning.contains("posted back to lull"), "{warning}");
        let elsewhere = config_of(&["--webhook-url", "http://127.0.0.1:9000/replies"]);
        assert_eq!(webhook_to_itself(&elsewhere, false), None);
        let warning = webhook_to_itself(&elsewhere, true).unwrap();
        assert!(warning.contains("host.docker.internal"), "{warning}");
        let receiver = config_of(&["--webhook-url", "http://receiver:9000/replies"]);
        assert_eq!(webhook_to_itself(&receiver, true), None);
    }
}

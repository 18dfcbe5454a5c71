//! `lull check`: validate the configuration and try every connection it names, then
//! print a readable report. Each failed line names the variable to fix; `warn` lines
//! ([`warnings`]) name what runs but is likely not meant, and pass. It changes
//! nothing: the database is inspected read-only (no file created, no migration).

mod warnings;

use std::fmt;
use std::time::Duration;

use crate::config::{Config, DiscordShards, LlmConfig, PlatformConfig};
use lull_core::access::AccessRule;
use lull_core::store::{DatabaseUrl, Inspection, PostgresStore, SqliteStore, StoredSchedule};
use lull_port::secrets::{Redactor, redact_url};
use secrecy::ExposeSecret;

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Finding {
    /// Whether lull can run with this (a warning is ok: it runs, perhaps not as meant).
    pub ok: bool,
    /// A warning: lull runs, but this is likely not what the operator meant.
    pub warn: bool,
    pub what: &'static str,
    pub detail: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}  {:<13} {}",
            match (self.ok, self.warn) {
                (false, _) => "FAIL",
                (true, true) => "warn",
                (true, false) => "ok  ",
            },
            self.what,
            self.detail
        )
    }
}

fn ok(what: &'static str, detail: impl Into<String>) -> Finding {
    Finding {
        ok: true,
        warn: false,
        what,
        detail: detail.into(),
    }
}

fn warn(what: &'static str, detail: impl Into<String>) -> Finding {
    Finding {
        warn: true,
        ..ok(what, detail)
    }
}

fn fail(what: &'static str, detail: impl Into<String>) -> Finding {
    Finding {
        ok: false,
        ..ok(what, detail)
    }
}

/// Run every check the configuration calls for.
pub(crate) async fn run(config: &Config) -> Vec<Finding> {
    let mut findings = vec![ok("configuration", describe(config))];
    if config.telegram.is_none() && config.discord.is_none() && config.http_adapter.is_none() {
        findings.push(fail(
            "adapters",
            "none configured: `lull run` would stop at once (set TELEGRAM_BOT_TOKEN, \
             DISCORD_BOT_TOKEN or LULL_WEBHOOK_URL); `lull chat` works without one",
        ));
    }
    let (database, found) = database(config).await;
    findings.push(database);
    findings.push(ok("access", access(config, &found.access)));
    findings.extend(warnings::warnings(config, &found.access));
    findings.push(jobs(config, &found.jobs));
    findings.push(ok("limits", config.dispatch.limits.describe()));
    findings.push(ok("prices", config.dispatch.limits.prices.describe()));
    for warning in config.price_warnings() {
        findings.push(warn("prices", warning));
    }
    if let Some(telegram) = &config.telegram {
        findings.push(telegram_bot(telegram).await);
    }
    if let Some(discord) = &config.discord {
        findings.push(discord_bot(discord).await);
    }
    if let Some(menus) = menus(config) {
        findings.push(ok("menus", menus));
    }
    if let Some(context) = group_context(config).await {
        findings.push(context);
    }
    if let Some(http) = &config.http_adapter {
        findings.push(ok(
            "http adapter",
            format!(
                "replies go to {} ({}); messages come in on http://{}/api/messages ({})",
                redact_url(&http.webhook.url),
                if http.webhook.secret.is_some() {
                    "signed"
                } else {
                    "unsigned: set LULL_WEBHOOK_SECRET to sign"
                },
                config.http_addr,
                if http.token.is_some() {
                    "bearer token required"
                } else {
                    "no token: loopback only"
                },
            ),
        ));
    }
    findings.push(model(config).await);
    findings.push(ok("controls", config.dispatch.controls.describe()));
    if let Some(tools) = &config.tools {
        findings.extend(mcp(tools).await);
    }
    if let Some(web) = &config.web {
        findings.push(web_tools(web).await);
    }
    findings
}

/// lull's web tools: whether fetch is on (and what it lets through besides public
/// addresses), and whether the search service answers a query with its JSON.
async fn web_tools(settings: &lull_core::tools::web::WebSettings) -> Finding {
    let fetch = match &settings.fetch {
        None => "lull__fetch off".to_owned(),
        Some(f) if f.allow.is_empty() => "lull__fetch on (public addresses only)".to_owned(),
        Some(f) => {
            let allow: Vec<String> = f.allow.iter().map(ToString::to_string).collect();
            format!(
                "lull__fetch on (public addresses and LULL_FETCH_ALLOW {})",
                allow.join(", ")
            )
        }
    };
    let Some(url) = &settings.search else {
        return ok(
            "web",
            format!("{fetch}; lull__search off (set LULL_SEARCH_URL)"),
        );
    };
    let web = match lull_core::tools::web::Web::new(settings) {
        Ok(web) => web,
        Err(e) => return fail("web", e),
    };
    let shown = redact_url(url.as_str());
    match web.probe_search().await {
        Some(Err(why)) => fail(
            "web",
            format!("{fetch}; lull__search: LULL_SEARCH_URL {shown}: {why}"),
        ),
        _ => ok(
            "web",
            format!("{fetch}; lull__search through {shown}: answers"),
        ),
    }
}

/// Connect to every MCP server of `LULL_MCP_CONFIG` and list its tools; one line a
/// server, a failure naming the server and the file.
async fn mcp(tools: &crate::config::ToolsConfig) -> Vec<Finding> {
    use lull_core::tools::Toolbox;
    let toolbox = tools.start();
    toolbox
        .wait_settled(tools.settings.connect_timeout + Duration::from_secs(1))
        .await;
    let offered = toolbox.tools();
    let findings = toolbox
        .servers()
        .into_iter()
        .map(|server| {
            if server.state == "ready" {
                let names: Vec<String> = offered
                    .iter()
                    .filter(|t| t.server == server.name)
                    .map(|t| format!("{}: {}", t.tool, t.effect.class()))
                    .collect();
                ok(
                    "mcp",
                    format!(
                        "{}: {} tools ({})",
                        server.name,
                        server.tools,
                        names.join(", ")
                    ),
                )
            } else {
                fail(
                    "mcp",
                    format!(
                        "{} (LULL_MCP_CONFIG {}): {}: {}",
                        server.name,
                        tools.mcp.source,
                        server.state,
                        server.error.as_deref().unwrap_or("no answer yet")
                    ),
                )
            }
        })
        .collect();
    toolbox.shutdown().await;
    findings
}

fn describe(config: &Config) -> String {
    let mut adapters: Vec<String> = Vec::new();
    if config.telegram.is_some() {
        adapters.push(match &config.telegram_webhook {
            Some(url) => format!("telegram (webhook at {})", redact_url(url.as_str())),
            None => "telegram".into(),
        });
    }
    if config.discord.is_some() {
        adapters.push(match config.discord_shards {
            DiscordShards::Fixed(1) => "discord".into(),
            DiscordShards::Fixed(n) => format!("discord ({n} shards)"),
            DiscordShards::Auto => "discord (shards: as Discord recommends)".into(),
        });
    }
    if config.http_adapter.is_some() {
        adapters.push("http".into());
    }
    let vision = if config.dispatch.vision {
        format!(
            "images to the model up to {} bytes, {} a reply ({} bytes in all)",
            config.dispatch.max_image_bytes,
            lull_core::limits::MAX_IMAGES_PER_PROMPT,
            lull_core::limits::MAX_IMAGE_BYTES_PER_ROUND
        )
    } else {
        "images off (LULL_VISION=off)".to_owned()
    };
    let tools = match &config.tools {
        Some(tools) => format!(
            "tools from {} MCP server(s) in {}",
            tools.mcp.servers.len(),
            tools.mcp.source
        ),
        None => "no tools".to_owned(),
    };
    let voice = match &config.transcribe {
        Some(t) => format!(
            "voice transcribed by {} up to {} s",
            t.model, config.dispatch.max_audio_seconds
        ),
        None => "voice not transcribed (echo)".to_owned(),
    };
    format!(
        "adapters: {}; debounce {} ms, cap {} ms, lease {} ms; {vision}; {voice}; {tools}",
        if adapters.is_empty() {
            "none (only `lull chat` will work)".to_owned()
        } else {
            adapters.join(", ")
        },
        match config.dispatch.timers.mode() {
            lull_core::rhythm::DebounceMode::Fixed =>
                config.dispatch.timers.debounce().as_millis().to_string(),
            lull_core::rhythm::DebounceMode::Adaptive => format!(
                "adaptive {}–{}",
                config.dispatch.timers.min_debounce().as_millis(),
                config.dispatch.timers.debounce().as_millis()
            ),
        },
        config.dispatch.timers.max_wait().as_millis(),
        config.dispatch.lease.ttl().as_millis()
    )
}

/// Who may use the bot: the lists, the admins, and the admins' run-time decisions
/// stored in the database (which win over the lists).
fn access(config: &Config, rules: &[AccessRule]) -> String {
    let access = &config.dispatch.access;
    let or = |s: String, none: &str| if s.is_empty() { none.to_owned() } else { s };
    let mut text = format!(
        "users: {}; chats: {}; admins: {}",
        or(access.users.describe(), "local only"),
        or(access.chats.describe(), "none"),
        or(access.admins.describe(), "none")
    );
    if !rules.is_empty() {
        let decided: Vec<String> = rules
            .iter()
            .map(|r| {
                format!(
                    "{} {} (by {})",
                    if r.allowed { "allowed" } else { "denied" },
                    r.subject,
                    r.set_by
                )
            })
            .collect();
        text.push_str(&format!("; at run time: {}", decided.join(", ")));
    }
    text
}

/// Looks at the database without changing it: `lull check` creates no file and
/// migrates nothing. Also returns the access decisions stored in it.
/// What the inspection of the database found beside its soundness.
#[derive(Default)]
struct Found {
    access: Vec<AccessRule>,
    jobs: Vec<StoredSchedule>,
}

async fn database(config: &Config) -> (Finding, Found) {
    let (finding, found) = inspect(config).await;
    (finding, found.unwrap_or_default())
}

/// The job table: how many jobs are active and when the next is due, and every stored
/// schedule and zone read back (one this build cannot read is paused when due).
fn jobs(config: &Config, jobs: &[StoredSchedule]) -> Finding {
    if config.dispatch.jobs.is_none() {
        return ok(
            "jobs",
            format!("off (LULL_JOBS=off); {} stored, none fires", jobs.len()),
        );
    }
    let unreadable: Vec<String> = jobs
        .iter()
        .filter(|job| {
            lull_core::schedule::Schedule::from_stored(&job.schedule).is_err()
                || job.timezone.parse::<lull_core::limits::TimeZone>().is_err()
        })
        .map(|job| format!("#{}", job.id))
        .collect();
    if !unreadable.is_empty() {
        return fail(
            "jobs",
            format!(
                "{} active; unreadable schedule or time zone: {} (they are paused when due; cancel them with /jobs cancel N)",
                jobs.len(),
                unreadable.join(", ")
            ),
        );
    }
    let tz = &config.dispatch.limits.timezone;
    let now = lull_core::domain::Timestamp::now();
    let next = jobs.iter().filter_map(|job| job.next_at).min();
    ok(
        "jobs",
        match next {
            Some(next) => format!("{} active, the next due {}", jobs.len(), tz.show(next, now)),
            None => "none active".to_owned(),
        },
    )
}

async fn inspect(config: &Config) -> (Finding, Option<Found>) {
    let shown = config.database.shown();
    let path = match &config.database {
        DatabaseUrl::Sqlite(path) => path.clone(),
        DatabaseUrl::Postgres(url) => return postgres(url.expose_secret(), &shown).await,
    };
    match tokio::task::spawn_blocking(move || SqliteStore::inspect(path)).await {
        Ok(Ok(Inspection::Missing { writable: true })) => (
            ok(
                "database",
                format!("{shown} does not exist yet; `lull run` creates it"),
            ),
            None,
        ),
        Ok(Ok(Inspection::Missing { writable: false })) => (
            fail(
                "database",
                format!(
                    "{shown} does not exist and its folder is not writable (check DATABASE_URL)"
                ),
            ),
            None,
        ),
        Ok(Ok(Inspection::Present {
            schema,
            latest,
            conversations,
            access,
            jobs,
        })) => (
            ok(
                "database",
                format!(
                    "{shown} is sound: {conversations} conversations, schema {schema}{}",
                    if schema < latest {
                        format!(" (`lull run` migrates it to {latest})")
                    } else {
                        String::new()
                    }
                ),
            ),
            Some(Found { access, jobs }),
        ),
        Ok(Err(e)) => (fail("database", format!("{e} (check DATABASE_URL)")), None),
        Err(e) => (
            fail("database", format!("the check itself failed: {e}")),
            None,
        ),
    }
}

/// Looks at a PostgreSQL database read-only: connects and reads the schema version;
/// creates nothing (`lull run` migrates an empty database).
async fn postgres(url: &str, shown: &str) -> (Finding, Option<Found>) {
    match PostgresStore::inspect(url).await {
        Ok(found) => (
            ok(
                "database",
                format!(
                    "{shown} answers (PostgreSQL {}): schema {}{}",
                    found.server,
                    found.schema,
                    if found.schema < found.latest {
                        format!(" (`lull run` migrates it to {})", found.latest)
                    } else {
                        String::new()
                    }
                ),
            ),
            Some(Found {
                access: found.access,
                jobs: found.jobs,
            }),
        ),
        Err(e) => (fail("database", format!("{e} (check DATABASE_URL)")), None),
    }
}

/// The command menus registered at start and the ack reaction, for the platforms
/// configured (`None` without Telegram and Discord).
fn menus(config: &Config) -> Option<String> {
    use lull_port::Menus;
    let menus = lull_port::Menus::of_commands();
    let mut shown = Vec::new();
    if config.telegram.is_some() {
        shown.push(format!(
            "telegram private chats {}, group admins {}",
            Menus::words(&menus.everyone),
            Menus::words(&menus.for_admins())
        ));
    }
    if config.discord.is_some() {
        shown.push(format!(
            "discord slash commands {}",
            Menus::words(&menus.everyone)
        ));
    }
    if shown.is_empty() {
        return None;
    }
    let reaction = match &config.dispatch.ack_reaction {
        Some(emoji) => format!("ack reaction {emoji} while a reply is pending"),
        None => "no ack reaction (LULL_ACK_REACTION=off)".to_owned(),
    };
    Some(format!("{}; {reaction}", shown.join("; ")))
}

/// Group context (`LULL_GROUP_CONTEXT`), when on: how many messages are kept, and
/// whether Telegram delivers them (only with the bot's privacy mode off, or to a bot
/// that is a group's admin).
async fn group_context(config: &Config) -> Option<Finding> {
    let keep = config.dispatch.group_context;
    if keep == 0 {
        return None;
    }
    let kept = format!(
        "the last {keep} messages per admitted group not addressed to lull are shown to the model"
    );
    let Some(telegram) = &config.telegram else {
        return Some(ok("group context", kept));
    };
    Some(
        match lull_adapters::telegram::reads_all_group_messages(telegram).await {
            Ok(true) => ok(
                "group context",
                format!("{kept}; Telegram privacy mode is off"),
            ),
            // Not a failure: a bot that is an admin of a group gets all its messages
            // whatever its privacy mode.
            Ok(false) => ok(
                "group context",
                format!(
                    "{kept}, but Telegram privacy mode is on (getMe: can_read_all_group_messages is false), so Telegram delivers them only in groups where the bot is an admin: \
                     to read all groups, send /setprivacy to @BotFather, choose the bot, Disable, then remove the bot from each group and add it again"
                ),
            ),
            Err(e) => fail("group context", e),
        },
    )
}

async fn telegram_bot(telegram: &PlatformConfig) -> Finding {
    match lull_adapters::telegram::whoami(telegram).await {
        Ok(username) => ok("telegram", format!("the token belongs to {username}")),
        Err(e) => fail(
            "telegram",
            format!("{e} [{}]", redact_url(&telegram.api_url)),
        ),
    }
}

async fn discord_bot(discord: &PlatformConfig) -> Finding {
    match lull_adapters::discord::whoami(discord).await {
        Ok(username) => ok("discord", format!("the token belongs to {username}")),
        Err(e) => fail("discord", format!("{e} [{}]", redact_url(&discord.api_url))),
    }
}

async fn model(config: &Config) -> Finding {
    let settings = match &config.llm {
        LlmConfig::Echo(_) => {
            return ok(
                "model",
                "echo (offline responder; set OPENAI_API_KEY or OPENAI_BASE_URL for a real model)",
            );
        }
        LlmConfig::OpenAi(settings) => settings,
    };
    let responder = match lull_core::llm::openai::OpenAiResponder::new(settings.clone()) {
        Ok(responder) => responder,
        Err(e) => return fail("model", e),
    };
    let server = redact_url(&settings.base_url);
    let redactor = Redactor::new(&settings.api_key.clone().unwrap_or_default());
    match responder.list_models().await {
        Ok(models) if models.iter().any(|m| m == &settings.model) => {
            ok("model", format!("{} is served by {server}", settings.model))
        }
        Ok(models) => {
            let shown: Vec<&str> = models.iter().take(8).map(String::as_str).collect();
            fail(
                "model",
                format!(
                    "{server} does not list OPENAI_MODEL={} (it lists: {}{})",
                    settings.model,
                    shown.join(", "),
                    if models.len() > shown.len() {
                        ", …"
                    } else {
                        ""
                    }
                ),
            )
        }
        Err(lull_core::llm::LlmError::Status {
            status: 401 | 403, ..
        }) => fail(
            "model",
            format!("{server} refused the key (check OPENAI_API_KEY)"),
        ),
        Err(e) => fail(
            "model",
            redactor.redact(format!(
                "cannot list models at {server}: {e} (check OPENAI_BASE_URL)"
            )),
        ),
    }
}

/// `lull healthcheck`: ask the running process's `/healthz` (for Docker's
/// `HEALTHCHECK`, without curl in the image). A wildcard listen address is asked on
/// loopback.
pub(crate) async fn healthcheck(addr: std::net::SocketAddr) -> Result<String, String> {
    let mut target = addr;
    if target.ip().is_unspecified() {
        target.set_ip(match target.ip() {
            std::net::IpAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::IpAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let url = format!("http://{target}/healthz");
    let response = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| e.to_string())?
        .get(&url)
        .send()
        .await
        .map_err(|e| {
            if e.is_connect() {
                format!(
                    "nothing listens on {target}: is `lull run` running, and is LULL_HTTP_ADDR the address it serves? (it logs \"HTTP server listening\" with its address at start)"
                )
            } else if e.is_timeout() {
                format!("{url} gave no answer within 5 s: the process may be stuck; its log says why")
            } else {
                format!("{url}: {}", e.without_url())
            }
        })?;
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    if status.is_success() {
        Ok(body)
    } else {
        Err(format!("{url} answered {status}: {body}"))
    }
}

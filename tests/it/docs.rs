//! The documentation a newcomer walks (README.md and docs/) is kept honest:
//! - every relative link points at a file that exists, and every `#anchor` at a heading;
//! - README.md stays between 8 and 12 KiB, and its first screen is the pitch, the
//!   feature list and the one-minute start, not benchmark figures;
//! - every shell command in a code block is run by a test here or by `.ci/run`, or is
//!   listed below with the reason it cannot run in CI;
//! - the README's two commands run: `cargo run --locked -- chat` is the binary cargo
//!   builds, run here with `chat` on the embedded defaults (an empty environment, a fresh
//!   folder), and `cargo test --locked` is the command `.ci/run` runs;
//! - the http adapter's example block runs as written, with the receiver of
//!   `docs/examples/`: the receiver verifies the reply's signature and prints it.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::process::{binary, free_port};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Commands that a test or `.ci/run` runs, and where. A location `tests/…: NAME` names
/// a test function in that file; `.ci/run` must contain the command itself.
const RUN: &[(&str, &str)] = &[
    (
        "cargo run --locked -- chat",
        "tests/it/docs.rs: the_readme_chat_command_runs_on_the_embedded_defaults",
    ),
    ("cargo test --locked", ".ci/run"),
    (
        r#"export LULL_WEBHOOK_SECRET="whsec_$(openssl rand -base64 32)""#,
        HTTP_EXAMPLE,
    ),
    (
        r#"export LULL_HTTP_TOKEN="$(openssl rand -hex 16)""#,
        HTTP_EXAMPLE,
    ),
    ("python3 docs/examples/webhook_receiver.py &", HTTP_EXAMPLE),
    (
        "LULL_WEBHOOK_URL=http://127.0.0.1:8000/lull-replies lull run &",
        HTTP_EXAMPLE,
    ),
    (
        "for _ in $(seq 50); do lull healthcheck >/dev/null 2>&1 && break; sleep 0.2; done",
        HTTP_EXAMPLE,
    ),
    (
        r#"curl -sS -w ' %{http_code}\n' -H "Authorization: Bearer $LULL_HTTP_TOKEN" -H 'Content-Type: application/json' -d '{"conversation":"room-1","user":"ada","name":"Ada","text":"hi","id":"m-1"}' http://127.0.0.1:8080/api/messages"#,
        HTTP_EXAMPLE,
    ),
];

const HTTP_EXAMPLE: &str = "tests/it/docs.rs: the_http_adapter_example_runs_with_its_receiver";

/// Commands that cannot run here, with the reason.
const CANNOT_RUN: &[(&str, &str)] = &[
    (
        "OPENAI_API_KEY=sk-... TELEGRAM_BOT_TOKEN=... LULL_ALLOWED_USERS=telegram:<your id> lull run",
        "needs a real Telegram bot token and an OpenAI key; the Telegram adapter runs against a fake Bot API in tests/it/telegram.rs",
    ),
    (
        "OPENAI_API_KEY=sk-... DISCORD_BOT_TOKEN=... LULL_ALLOWED_USERS=discord:<your user id> lull run",
        "needs a real Discord bot token and an OpenAI key; the Discord adapter runs against a fake gateway in tests/it/discord.rs",
    ),
    (
        "OPENAI_API_KEY=sk-... cargo run --locked -- chat",
        "needs a paid OpenAI key; `lull chat` against an OpenAI-compatible server runs in tests/it/quirks.rs and tests/it/real_models.rs",
    ),
    (
        "OPENAI_BASE_URL=http://localhost:11434/v1 OPENAI_MODEL=llama3.2 cargo run --locked -- chat",
        "needs Ollama with llama3.2 pulled (2 GB); the real-server tier runs llama.cpp's server instead (tests/it/real_models.rs)",
    ),
    (
        "ollama pull llama3.2",
        "needs Ollama and downloads a 2 GB model",
    ),
    (
        "OPENAI_BASE_URL=http://localhost:11434/v1 OPENAI_MODEL=llama3.2 TELEGRAM_BOT_TOKEN=... LULL_ALLOWED_USERS=telegram:<your id> lull run",
        "needs Ollama and a real Telegram bot token",
    ),
    (
        "cargo install --locked --path .",
        "a second, optimised build into ~/.cargo/bin (about 10 minutes on 2 cores); scripts/docker-smoke, run by .ci/run where Docker works, makes the same release build",
    ),
    (
        "cargo build --release",
        "the same optimised build as cargo install, without installing it; made by scripts/docker-smoke inside the image",
    ),
    (
        "cp .env.example .env",
        "the first step of the Docker setup: the `.env` it makes is for the compose file, which needs a Docker engine",
    ),
    (
        "docker compose up -d",
        "needs a Docker engine with Compose; scripts/docker-smoke (run by .ci/run where Docker works) builds and starts the same image",
    ),
    (
        "docker compose logs -f lull",
        "needs a Docker engine with Compose, and follows the logs until interrupted",
    ),
];

/// README.md and every page of docs/.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![Path::new(ROOT).join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(Path::new(ROOT).join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

fn name(page: &Path) -> String {
    page.strip_prefix(ROOT).unwrap().display().to_string()
}

/// The text outside fenced code blocks, and the fenced blocks with their language.
fn split(text: &str) -> (String, Vec<(String, String)>) {
    let mut prose = String::new();
    let mut blocks = Vec::new();
    let mut open: Option<(String, String)> = None;
    // A block's lines lose the indentation of its fence (a block in a list item).
    let mut indent = 0;
    for line in text.lines() {
        let trimmed = line.trim_start();
        match (&mut open, trimmed.strip_prefix("```")) {
            (None, Some(language)) => {
                indent = line.len() - trimmed.len();
                open = Some((language.trim().to_owned(), String::new()));
            }
            (Some(_), Some(_)) => blocks.push(open.take().unwrap()),
            (Some((_, body)), None) => {
                let cut = line.len() - trimmed.len();
                body.push_str(&line[cut.min(indent)..]);
                body.push('\n');
            }
            (None, None) => {
                prose.push_str(line);
                prose.push('\n');
            }
        }
    }
    assert!(open.is_none(), "an unclosed code block");
    (prose, blocks)
}

/// GitHub's anchors for a page's headings.
fn anchors(text: &str) -> BTreeSet<String> {
    split(text)
        .0
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| {
            l.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect()
}

/// The targets of a page's Markdown links (`[text](target)`), outside code blocks.
fn links(text: &str) -> Vec<String> {
    let prose = split(text).0;
    let mut links = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let end = rest
            .find(')')
            .expect("a link without its closing parenthesis");
        links.push(rest[..end].to_owned());
        rest = &rest[end..];
    }
    links
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for link in links(&text) {
            if link.starts_with("http://") || link.starts_with("https://") {
                continue;
            }
            let (path, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let target = if path.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(path)
            };
            assert!(
                target.exists(),
                "{}: the link {link} points at a file that does not exist",
                name(&page)
            );
            if !anchor.is_empty() {
                let headings = anchors(&std::fs::read_to_string(&target).unwrap());
                assert!(
                    headings.contains(anchor),
                    "{}: the link {link} names an anchor {} does not have: {headings:?}",
                    name(&page),
                    name(&target)
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 50, "only {checked} links found");
}

#[test]
fn the_docs_table_of_contents_lists_every_page() {
    let toc = std::fs::read_to_string(Path::new(ROOT).join("docs/README.md")).unwrap();
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    for page in pages().iter().skip(1) {
        let file = page.file_name().unwrap().to_str().unwrap();
        if file == "README.md" {
            continue;
        }
        assert!(
            toc.contains(&format!("]({file})")),
            "docs/README.md lists {file}"
        );
        assert!(
            readme.contains(&format!("](docs/{file})")),
            "README.md links docs/{file}"
        );
    }
}

#[test]
fn the_readme_is_8_to_12_kib_and_starts_with_the_pitch_and_the_start() {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    assert!(
        (8 * 1024..=12 * 1024).contains(&readme.len()),
        "README.md is {} bytes",
        readme.len()
    );
    // The first screen: about 45 lines of a terminal or a repository page.
    let first_screen: String = readme.lines().take(45).collect::<Vec<_>>().join("\n");
    for heading in ["## What it does", "## One-minute start"] {
        assert!(
            first_screen.contains(heading),
            "{heading} on the first screen"
        );
    }
    for figure in ["per second", "p99", "MiB", "BENCHMARKS"] {
        assert!(
            !first_screen.contains(figure),
            "no benchmark figures on the first screen ({figure})"
        );
    }
    let docker = readme.find("## Docker").expect("a Docker section");
    assert!(readme[..docker].lines().count() < 90, "Docker near the top");
}

/// A code block's shell commands: comments dropped, continued lines joined.
fn commands(block: &str) -> Vec<String> {
    let mut commands = Vec::new();
    let mut current = String::new();
    for line in block.lines() {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        // A comment after a command is set off by whitespace.
        let line = match line.find(" #") {
            Some(at) => line[..at].trim_end(),
            None => line,
        };
        let (line, continued) = match line.strip_suffix('\\') {
            Some(line) => (line.trim_end(), true),
            None => (line, false),
        };
        if !current.is_empty() && !line.is_empty() {
            current.push(' ');
        }
        current.push_str(line);
        if !continued && !current.is_empty() {
            commands.push(std::mem::take(&mut current));
        }
    }
    commands
}

#[test]
fn every_documented_command_is_run_or_says_why_not() {
    let mut seen = BTreeSet::new();
    for page in pages() {
        let (_, blocks) = split(&std::fs::read_to_string(&page).unwrap());
        for (language, body) in blocks {
            if !matches!(language.as_str(), "sh" | "bash" | "shell" | "console") {
                continue;
            }
            for command in commands(&body) {
                let known = RUN.iter().any(|(c, _)| *c == command)
                    || CANNOT_RUN.iter().any(|(c, _)| *c == command);
                assert!(
                    known,
                    "{}: the command `{command}` is neither run by a test or .ci/run nor listed in \
                     CANNOT_RUN (tests/it/docs.rs) with the reason",
                    name(&page)
                );
                seen.insert(command);
            }
        }
    }
    // No stale entries, and every location is real.
    for (command, _) in RUN.iter().chain(CANNOT_RUN) {
        assert!(
            seen.contains(*command),
            "`{command}` is in no code block any more"
        );
    }
    for (command, location) in RUN {
        match location.split_once(": ") {
            Some((file, test)) => {
                let source = std::fs::read_to_string(Path::new(ROOT).join(file)).unwrap();
                assert!(
                    source.contains(&format!("fn {test}()")),
                    "{file} has the test {test}"
                );
            }
            None => {
                let source = std::fs::read_to_string(Path::new(ROOT).join(location)).unwrap();
                assert!(
                    source.lines().any(|l| l.trim() == *command),
                    "{location} runs `{command}`"
                );
            }
        }
    }
}

/// `cargo run --locked -- chat` is cargo building the binary and running it with `chat`:
/// the binary is run so here, with nothing in its environment but `PATH` and `HOME`, in
/// a fresh folder (the embedded defaults: `sqlite:lull.db` there, the `echo` responder).
#[test]
fn the_readme_chat_command_runs_on_the_embedded_defaults() {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    assert!(readme.contains("```sh\ncargo run --locked -- chat\ncargo test --locked\n```"));
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(binary())
        .arg("chat")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", dir.path())
        .current_dir(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start lull chat");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"alpha\nbravo\ncharlie\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.trim_end(),
        "[echo] 3 messages:\nalpha\nbravo\ncharlie",
        "one reply covering the three lines"
    );
    assert!(
        dir.path().join("lull.db").exists(),
        "the default database is lull.db in the current folder"
    );
}

/// The shell running the example: on SIGTERM its trap stops the receiver and lull it
/// started in the background.
struct Shell(std::process::Child);

impl Drop for Shell {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

fn available(program: &str, arg: &str) -> bool {
    Command::new(program)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// The http adapter's example block of docs/http-adapter.md, run by bash as it
/// stands but on free ports (the receiver's through `RECEIVER_ADDR`, lull's through
/// `LULL_HTTP_ADDR`), with `lull` on `PATH` and a fresh folder holding `docs/`: lull
/// (on its defaults, the `echo` responder) signs the reply with the secret both read
/// from the environment, and the receiver verifies it and prints it; a forged request
/// is refused. The receiver's `verify` is the one the page shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_adapter_example_runs_with_its_receiver() {
    for (program, arg) in [
        ("python3", "--version"),
        ("openssl", "version"),
        ("curl", "--version"),
    ] {
        if !available(program, arg) {
            crate::support::skip::skipped(
                "the http adapter example",
                &format!("{program} is not installed"),
            );
            return;
        }
    }
    let page = std::fs::read_to_string(Path::new(ROOT).join("docs/http-adapter.md")).unwrap();
    let (_, blocks) = split(&page);
    let block = blocks
        .iter()
        .find(|(language, body)| language == "sh" && body.contains("webhook_receiver.py"))
        .map(|(_, body)| body.clone())
        .expect("docs/http-adapter.md has the example block");
    let run_line = block.lines().find(|l| l.contains("lull run")).unwrap();
    assert!(
        !run_line.contains("LULL_WEBHOOK_SECRET"),
        "the secret is made once and read from the environment, not invented in the `lull run` line"
    );
    let receiver =
        std::fs::read_to_string(Path::new(ROOT).join("docs/examples/webhook_receiver.py")).unwrap();
    let python = &blocks.iter().find(|(l, _)| l == "python").unwrap().1;
    let shown_verify = python
        .split("def verify")
        .nth(1)
        .and_then(|rest| rest.split("\n\n").next())
        .unwrap();
    assert!(
        receiver.contains(&format!("def verify{shown_verify}")),
        "the receiver's verify is the page's"
    );

    let (receiver_port, lull_port) = (free_port(), free_port());
    let script = block
        .replace("127.0.0.1:8000", &format!("127.0.0.1:{receiver_port}"))
        .replace("127.0.0.1:8080", &format!("127.0.0.1:{lull_port}"));
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(Path::new(ROOT).join("docs"), dir.path().join("docs")).unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(binary(), bin.join("lull")).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let output = dir.path().join("output");
    let stderr = dir.path().join("stderr");
    // The block, then a wait for the background processes it started, which a TERM
    // (the end of the test) ends, stopping them.
    let wrapped = format!(
        "trap 'kill $(jobs -p) 2>/dev/null; exit 0' TERM\nset -e\n{script}\necho 'the block ran'\nwait\n"
    );
    let shell = Command::new("bash")
        .args(["-c", &wrapped])
        .env_clear()
        .env("PATH", path)
        .env("HOME", dir.path())
        .env("RECEIVER_ADDR", format!("127.0.0.1:{receiver_port}"))
        .env("LULL_HTTP_ADDR", format!("127.0.0.1:{lull_port}"))
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&output).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .expect("start bash");
    let mut shell = Shell(shell);
    let logs = || {
        format!(
            "stdout:\n{}\nstderr:\n{}",
            std::fs::read_to_string(&output).unwrap_or_default(),
            std::fs::read_to_string(&stderr).unwrap_or_default()
        )
    };

    // The block ends with the curl; the receiver and lull go on in the background.
    let started = Instant::now();
    while !std::fs::read_to_string(&output)
        .unwrap()
        .contains("the block ran")
    {
        let status = shell.0.try_wait().unwrap();
        assert!(status.is_none(), "the block fails: {status:?}\n{}", logs());
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the block hangs\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        std::fs::read_to_string(&output)
            .unwrap()
            .contains(r#"{"status":"stored","version":1} 202"#),
        "lull stored the message\n{}",
        logs()
    );

    // The receiver prints the reply once it verified it.
    let reply = loop {
        let printed = std::fs::read_to_string(&output).unwrap();
        if let Some(line) = printed
            .lines()
            .find(|l| l.starts_with(r#"{"conversation""#))
        {
            break serde_json::from_str::<serde_json::Value>(line).unwrap();
        }
        let status = shell.0.try_wait().unwrap();
        assert!(status.is_none(), "the shell ended: {status:?}\n{}", logs());
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no verified reply\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(reply["conversation"], "room-1");
    assert_eq!(reply["covers"], serde_json::json!(["m-1"]));
    assert_eq!(reply["kind"], "reply");
    assert!(reply["text"].as_str().unwrap().contains("hi"), "{reply}");

    // A request lull did not sign is refused.
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{receiver_port}/lull-replies");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .to_string();
    for signature in [None, Some("v1,bm90IGEgc2lnbmF0dXJl")] {
        let mut request = client
            .post(&url)
            .header("webhook-id", "msg_forged")
            .header("webhook-timestamp", &now)
            .body(r#"{"conversation":"room-1","text":"forged","covers":[],"kind":"reply"}"#);
        if let Some(signature) = signature {
            request = request.header("webhook-signature", signature);
        }
        assert_eq!(request.send().await.unwrap().status(), 401);
    }
    assert!(
        !std::fs::read_to_string(&output).unwrap().contains("forged"),
        "a forged reply is not shown"
    );
}

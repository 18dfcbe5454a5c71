//! `lull chat`, run as the real binary on a real database file.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::helpers::{db, temp_db};

fn lull_chat(
    db: &std::path::Path,
    input: &str,
    extra_env: &[(&str, &str)],
) -> std::process::Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lull"))
        .arg("chat")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("DATABASE_URL", format!("sqlite:{}", db.display()))
        .env("LULL_DEBOUNCE_MS", "300")
        .envs(extra_env.iter().copied())
        .current_dir(db.parent().unwrap())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start lull chat");
    // The program may exit before reading (bad settings): a closed pipe is fine.
    let _ = child.stdin.take().unwrap().write_all(input.as_bytes());
    child.wait_with_output().expect("lull chat finishes")
}

/// Test 1: three lines in a row get exactly one reply, containing all three.
#[test]
fn three_lines_get_one_reply_with_all_three() {
    let db = temp_db();
    let out = lull_chat(&db.path, "alpha\nbravo\ncharlie\n", &[]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "exit {:?}; stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.matches("[echo]").count(),
        1,
        "exactly one reply: {stdout:?}"
    );
    assert_eq!(
        stdout.trim_end(),
        "[echo] 3 messages:\nalpha\nbravo\ncharlie"
    );
    assert_eq!(db::replies(&db.path).len(), 1);
}

#[test]
fn stdout_carries_replies_only_and_history_persists() {
    let db = temp_db();
    let first = lull_chat(&db.path, "one\n", &[("RUST_LOG", "debug")]);
    assert!(first.status.success());
    assert_eq!(
        String::from_utf8(first.stdout).unwrap().trim_end(),
        "[echo] 1 message:\none"
    );
    assert!(!first.stderr.is_empty(), "logs go to stderr");
    let second = lull_chat(&db.path, "two\n", &[]);
    assert_eq!(
        String::from_utf8(second.stdout).unwrap().trim_end(),
        "[echo] 1 message:\ntwo"
    );
    assert_eq!(
        db::replies(&db.path).len(),
        2,
        "the same conversation continues in the same file"
    );
}

#[test]
fn empty_input_exits_at_once() {
    let db = temp_db();
    let out = lull_chat(&db.path, "", &[]);
    assert!(out.status.success());
    assert!(out.stdout.is_empty());
}

#[test]
fn commands_answer_without_the_model() {
    let db = temp_db();
    let out = lull_chat(&db.path, "/help\n", &[]);
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains("/reset"), "{stdout}");
    assert!(!stdout.contains("[echo]"));
}

/// `/status` right after `/prompt` says nothing waits: the command's own notice, not
/// yet delivered, is not a message waiting for an answer.
#[test]
fn status_right_after_a_prompt_says_nothing_waits() {
    let db = temp_db();
    let out = lull_chat(&db.path, "/prompt Be short.\n/status\n", &[]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("Waiting for an answer: nothing"),
        "{stdout}"
    );
}

#[test]
fn bad_settings_stop_the_program_naming_the_variable() {
    let db = temp_db();
    for (variable, value, expected) in [
        ("LULL_DEBOUNCE_MS", "soon", "LULL_DEBOUNCE_MS"),
        // A number says the form it expects.
        (
            "LULL_DEBOUNCE_MS",
            "1.5s",
            "invalid LULL_DEBOUNCE_MS: \"1.5s\" is not whole milliseconds (a number such as 1500)",
        ),
        (
            "LULL_MAX_AUDIO_SECONDS",
            "5m",
            "\"5m\" is not whole seconds",
        ),
        ("LULL_MAX_WAIT_MS", "100", "LULL_DEBOUNCE_MS"),
        ("LULL_ECHO_DELAY_MS", "9..1", "LULL_ECHO_DELAY_MS"),
        // A setting with a parser of its own says its own form.
        (
            "LULL_ECHO_DELAY_MS",
            "fast",
            "a range `MIN..MAX`, got 'fast'",
        ),
        ("DATABASE_URL", "mysql://db", "DATABASE_URL"),
        ("LULL_ALLOWED_USERS", "nobody", "LULL_ALLOWED_USERS"),
        ("LULL_ALLOWED_CHATS", "-100123", "LULL_ALLOWED_CHATS"),
        ("LULL_ADMINS", "telegram:*", "LULL_ADMINS"),
        ("LULL_TIMEZONE", "Mars/Olympus", "LULL_TIMEZONE"),
        ("LULL_RATE_PER_MIN", "-1", "LULL_RATE_PER_MIN"),
        ("LULL_DAILY_TOKENS", "lots", "LULL_DAILY_TOKENS"),
        // A budget that cannot hold one reply would hold every message for good.
        (
            "LULL_USER_DAILY_TOKENS",
            "50",
            "LULL_USER_DAILY_TOKENS=50 cannot hold one reply",
        ),
        ("LULL_DAILY_TOKENS", "20", "LULL_MAX_TOKENS"),
        ("LULL_LLM", "gpt", "LULL_LLM"),
        ("RUST_LOG", "info,[", "RUST_LOG"),
    ] {
        let out = lull_chat(&db.path, "hello\n", &[(variable, value)]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{variable}={value}: {stderr}");
        assert!(stderr.contains(expected), "{variable}={value}: {stderr}");
        assert!(out.stdout.is_empty());
    }
    assert!(
        !db.path.exists(),
        "bad settings stop the program before it opens the database"
    );
}

/// `LOG_FORMAT=json`: every log line is a JSON object, and each reply has one line
/// with its conversation, version, batch size, lease token and model time.
#[test]
fn json_logs_have_one_line_per_reply() {
    let db = temp_db();
    let out = lull_chat(
        &db.path,
        "one\ntwo\n",
        &[("LOG_FORMAT", "json"), ("RUST_LOG", "info")],
    );
    assert!(out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let replies: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["message"] == "reply committed")
        .collect();
    assert_eq!(replies.len(), 1, "{stderr}");
    let reply = replies[0];
    for field in [
        "conversation",
        "version",
        "batch",
        "token",
        "llm_ms",
        "level",
        "timestamp",
    ] {
        assert!(!reply[field].is_null(), "missing {field} in {reply}");
    }
    assert_eq!(reply["batch"], 2);
}

//! Test-only switches that turn one protection off, so a counter-test can show that
//! the stress checker catches what the protection prevents. They exist only in builds
//! with the `test-switches` feature (`cargo test` builds); every other build reads
//! nothing and keeps every protection.

/// `LULL_TEST_DEFER_MARKS=1`: a delivered part's sent-mark waits in memory until the
/// next part's mark or the lease's release, and is written once, dropped if that write
/// fails (the behaviour before marks became facts).
pub(crate) fn defer_marks() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| on("LULL_TEST_DEFER_MARKS"))
}

/// `LULL_TEST_UNBOUNDED_SENDS=1`: lease renewals run without a client-side deadline and
/// sends start whatever validity is left (the behaviour before sends were bounded by
/// the lease).
pub(crate) fn unbounded_sends() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| on("LULL_TEST_UNBOUNDED_SENDS"))
}

/// `LULL_TEST_NO_JOURNAL=1`: tool calls that act run without a reservation in the
/// journal, like read-only ones (the behaviour of bots without one: a retried round
/// acts again).
pub(crate) fn no_journal() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| on("LULL_TEST_NO_JOURNAL"))
}

/// `LULL_TEST_UNFENCED_CONTROLS=1`: a changed setting, `/new` and `/stop` leave the
/// conversation's version alone (the behaviour of bots whose settings are not part of
/// the final check): a generation in flight is neither stopped nor found stale.
pub(crate) fn unfenced_controls() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| on("LULL_TEST_UNFENCED_CONTROLS"))
}

/// `LULL_TEST_NO_ACK_CLAIM=1`: every stored message whose reply is not immediate gets
/// the ack reaction, without the store's once-per-burst claim (the behaviour of bots
/// that react to every message).
pub(crate) fn no_ack_claim() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| on("LULL_TEST_NO_ACK_CLAIM"))
}

/// `LULL_TEST_NO_COMMAND_CLAIM=1`: a command acts each time it is received, even when
/// its platform delivers it again (the behaviour of bots that act on every update).
pub(crate) fn no_command_claim() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| on("LULL_TEST_NO_COMMAND_CLAIM"))
}

/// `LULL_TEST_NO_COMMAND_DEDUPE=1`: a command is answered once per process that
/// received it, not once per message id (the behaviour of replicas that each answer
/// what reached them: a slash command delivered to two would be answered twice).
pub(crate) fn no_command_dedupe() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| on("LULL_TEST_NO_COMMAND_DEDUPE"))
}

/// `LULL_TEST_NO_BURST_WINDOW=1`: adaptive waiting forgets the gaps it learned: a
/// conversation whose rhythm is known always waits the shortest window (a debounce that
/// only shortens, the behaviour the burst window prevents: fragment bursts split).
pub(crate) fn no_burst_window() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| on("LULL_TEST_NO_BURST_WINDOW"))
}

/// `LULL_TEST_NO_TEXT_CUES=1`: adaptive waiting reads no text: every message counts as
/// complete and its wait comes from the rhythm's timing alone (the behaviour before text
/// cues: a fragment after a run of complete messages waits the shortest window).
pub(crate) fn no_text_cues() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| on("LULL_TEST_NO_TEXT_CUES"))
}

/// `LULL_TEST_BUSY_TIMEOUT_MS=N`: SQLite's busy timeout is `N` ms instead of `default`
/// (not a protection: a shorter timeout lets a test's lock outlast it quickly).
pub(crate) fn busy_timeout(default: std::time::Duration) -> std::time::Duration {
    #[cfg(feature = "test-switches")]
    if let Some(ms) = std::env::var("LULL_TEST_BUSY_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return std::time::Duration::from_millis(ms);
    }
    default
}

/// `LULL_TEST_NO_OCCURRENCE_KEY=1`: a job's occurrence is fired without its key (no
/// compare-and-swap of the instant, no unique occurrence, a dedupe key per process):
/// the behaviour of schedulers that run what they read as due, so two processes
/// reading the same due job both fire it.
pub(crate) fn no_occurrence_key() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| on("LULL_TEST_NO_OCCURRENCE_KEY"))
}

/// `LULL_TEST_MEMORY_WRITE_BACK=1`: a reply's commit writes each scope it remembers
/// in back whole — the memories its round read, then the new facts — instead of
/// inserting rows (the behaviour of memory files rewritten after a long run: what
/// another round added meanwhile is lost).
pub(crate) fn memory_write_back() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| on("LULL_TEST_MEMORY_WRITE_BACK"))
}

/// `LULL_TEST_UNFENCED_MEMORY=1`: a reply's commit writes the facts its round staged
/// even when `/memory clear` or `/forgetme` came after the round read its batch, and
/// a summary is stored even when `/forgetme` came after its picture was read (the
/// behaviour of bots whose memory writes do not look at what changed meanwhile).
pub(crate) fn unfenced_memory() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| on("LULL_TEST_UNFENCED_MEMORY"))
}

/// `LULL_TEST_SUMMARY_WRITE_BACK=1`: storing a summary writes the conversation's
/// history back trimmed, as the peers save a summarised history file: the summary
/// replaces the stored one whatever it covers and whoever holds the summary lease,
/// and the texts of the messages it covers and of every message after its picture are
/// removed (what arrived while it was written is lost).
pub(crate) fn summary_write_back() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| on("LULL_TEST_SUMMARY_WRITE_BACK"))
}

/// `LULL_TEST_UNRESERVED_DOLLARS=1`: a round reserves no dollars before asking the
/// model, only checks that some are left (a nano-dollar), and charges what was spent
/// afterwards: the peers' "check, then bill", whose processes answering at once
/// overspend a dollar budget together (the money tests' counter-test).
pub(crate) fn unreserved_dollars() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| on("LULL_TEST_UNRESERVED_DOLLARS"))
}

/// `LULL_TEST_RESOLVE=name=address,…`: the web fetch's resolver answers these names
/// with these addresses before asking the system (a public-looking name that resolves
/// to loopback, without a hosts file). Its answers are judged like any other.
#[cfg(feature = "test-switches")]
pub(crate) fn test_resolve(host: &str) -> Option<std::net::IpAddr> {
    static MAP: std::sync::OnceLock<Vec<(String, std::net::IpAddr)>> = std::sync::OnceLock::new();
    MAP.get_or_init(|| {
        std::env::var("LULL_TEST_RESOLVE")
            .unwrap_or_default()
            .split(',')
            .filter_map(|pair| {
                let (name, ip) = pair.split_once('=')?;
                Some((name.trim().to_ascii_lowercase(), ip.trim().parse().ok()?))
            })
            .collect()
    })
    .iter()
    .find(|(name, _)| name.eq_ignore_ascii_case(host))
    .map(|(_, ip)| *ip)
}

#[cfg(not(feature = "test-switches"))]
pub(crate) fn test_resolve(_host: &str) -> Option<std::net::IpAddr> {
    None
}

#[cfg(feature = "test-switches")]
fn on(name: &str) -> bool {
    let on = std::env::var(name).is_ok_and(|v| v == "1");
    if on {
        tracing::warn!(
            "{name}=1: a protection is OFF (counter-test build); replies may be duplicated"
        );
    }
    on
}

#[cfg(not(feature = "test-switches"))]
fn on(_name: &str) -> bool {
    false
}

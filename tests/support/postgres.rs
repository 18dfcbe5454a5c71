//! A throwaway PostgreSQL cluster for the tests: `initdb` into a temporary folder
//! (as the `postgres` user when the tests run as root: the server refuses to run as
//! root), `pg_ctl start` on a free loopback port with trust authentication, a fresh
//! database per test. One cluster serves the whole test binary; a watchdog stops it
//! when the test process exits, however it exits. A test that restarts its server
//! (the stress run with a server restart) or needs a durable one (the benchmark)
//! starts a [`Cluster::private`] one instead, stopped when dropped, so no other test
//! sees its server go away.
//!
//! The server binaries are looked for in `LULL_PG_BIN`, then
//! `/usr/lib/postgresql/<version>/bin` (newest first). Without them the PostgreSQL
//! tests are skipped with one printed line, unless `LULL_REQUIRE_POSTGRES=1` (CI),
//! which turns a missing PostgreSQL into a failure.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A running cluster.
#[derive(Debug)]
pub(crate) struct Cluster {
    bin: PathBuf,
    port: u16,
    /// Where the cluster lives (removed with the test process's temporary files).
    dir: PathBuf,
    /// The server's command-line settings, given again on a restart.
    options: String,
    /// Whether the server runs as the `postgres` user (the tests run as root).
    root: bool,
    _keep: tempfile::TempDir,
}

/// How a cluster treats a commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durability {
    /// Tests: no fsync, commits acknowledged before they reach the disk (a restart
    /// with `-m fast` still writes everything out; only a crash of the machine loses
    /// commits, which no test does).
    Off,
    /// Benchmarks: PostgreSQL's defaults, `fsync` and `synchronous_commit` on, so a
    /// commit is on the disk before it is acknowledged, as in production.
    On,
}

/// The cluster of this test binary, started on first use; `None` (with one printed
/// line) when PostgreSQL is not installed and not required.
pub(crate) fn cluster() -> Option<&'static Cluster> {
    static CLUSTER: OnceLock<Option<Cluster>> = OnceLock::new();
    CLUSTER
        .get_or_init(|| binaries().map(|bin| Cluster::start(bin.to_owned(), Durability::Off)))
        .as_ref()
}

/// The PostgreSQL server binaries (and `psql`); `None` (with one printed line, once)
/// when they are not installed and not required; a panic when `LULL_REQUIRE_POSTGRES=1`.
pub(crate) fn binaries() -> Option<&'static Path> {
    static BIN: OnceLock<Option<PathBuf>> = OnceLock::new();
    BIN.get_or_init(|| match server_binaries() {
        Some(bin) => Some(bin),
        None if required() => panic!(
            "LULL_REQUIRE_POSTGRES=1 but no PostgreSQL server binaries were found \
             (set LULL_PG_BIN or install postgresql)"
        ),
        None => {
            // Once for the binary: every PostgreSQL test is skipped.
            super::skip::skipped(
                "the PostgreSQL tests",
                "PostgreSQL is not installed (no initdb in LULL_PG_BIN or /usr/lib/postgresql/*/bin)",
            );
            None
        }
    })
    .as_deref()
}

/// A fresh, empty database on the test cluster: its `postgres://` URL. `None` when
/// PostgreSQL is not available (the caller returns: the test is skipped).
pub(crate) fn fresh_database() -> Option<String> {
    cluster().map(Cluster::create_database)
}

fn required() -> bool {
    std::env::var("LULL_REQUIRE_POSTGRES").is_ok_and(|v| v == "1")
}

fn server_binaries() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("LULL_PG_BIN") {
        let dir = PathBuf::from(dir);
        return dir.join("initdb").is_file().then_some(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// `program` from the server binaries, run as the `postgres` user when we are root.
fn server_command(bin: &Path, program: &str, root: bool) -> Command {
    if root {
        let mut command = Command::new("runuser");
        command
            .args(["-u", "postgres", "--"])
            .arg(bin.join(program));
        command
    } else {
        Command::new(bin.join(program))
    }
}

fn run(mut command: Command, what: &str) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(
        output.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

impl Cluster {
    /// A cluster of the caller's own, stopped when it is dropped (and by the watchdog
    /// if the test process dies first): for a test that restarts the server, or a
    /// benchmark that needs commits on the disk. `None` when PostgreSQL is not
    /// available (see [`binaries`]).
    pub(crate) fn private(durability: Durability) -> Option<Cluster> {
        binaries().map(|bin| Cluster::start(bin.to_owned(), durability))
    }

    fn start(bin: PathBuf, durability: Durability) -> Cluster {
        let root = is_root();
        let keep = tempfile::Builder::new()
            .prefix("lull-pg-")
            .tempdir()
            .expect("a folder for the test cluster");
        let dir = keep.path().join("data");
        std::fs::create_dir(&dir).expect("the cluster's folder");
        if root {
            // The folder and its parent are the postgres user's, who runs the server.
            for path in [keep.path(), dir.as_path()] {
                run(
                    {
                        let mut c = Command::new("chown");
                        c.arg("postgres:postgres").arg(path);
                        c
                    },
                    "chown",
                );
            }
        }
        let mut initdb = server_command(&bin, "initdb", root);
        initdb.arg("-D").arg(&dir).args([
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
        ]);
        run(initdb, "initdb");
        let port = crate::support::process::free_port();
        let mut options = format!(
            "-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} \
             -c max_connections=300",
            dir.display()
        );
        if durability == Durability::Off {
            options.push_str(" -c fsync=off -c synchronous_commit=off -c full_page_writes=off");
        }
        // Stop the cluster when this test process ends, however it ends.
        let stop = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; {runas}{pg_ctl} -D {dir} -m immediate stop >/dev/null 2>&1; rm -rf {keep}",
            pid = std::process::id(),
            runas = if root { "runuser -u postgres -- " } else { "" },
            pg_ctl = bin.join("pg_ctl").display(),
            dir = dir.display(),
            keep = keep.path().display(),
        );
        // Never waited for: it outlives this process on purpose.
        #[allow(clippy::zombie_processes)]
        Command::new("setsid")
            .args(["sh", "-c", &stop])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("the cluster's watchdog");
        let cluster = Cluster {
            bin,
            port,
            dir,
            options,
            root,
            _keep: keep,
        };
        cluster.pg_ctl_start();
        cluster
    }

    fn pg_ctl_start(&self) {
        let mut start = server_command(&self.bin, "pg_ctl", self.root);
        start
            .arg("-D")
            .arg(&self.dir)
            .arg("-o")
            .arg(&self.options)
            .arg("-l")
            .arg(self.dir.join("server.log"))
            .args(["-w", "-t", "60", "start"]);
        run(start, "pg_ctl start");
    }

    fn pg_ctl_stop(&self, mode: &str) {
        let mut stop = server_command(&self.bin, "pg_ctl", self.root);
        stop.arg("-D")
            .arg(&self.dir)
            .args(["-m", mode, "-w", "-t", "60", "stop"]);
        run(stop, "pg_ctl stop");
    }

    /// Restart the server as an operator does (`pg_ctl stop -m fast`, then start on
    /// the same port with the same settings), down for `down` in between: every
    /// session is disconnected, committed work survives, and clients see refused
    /// connections until it is back. Blocks until the server accepts connections
    /// again. Only for a [`Cluster::private`] one: other tests share the other.
    pub(crate) fn restart(&self, down: std::time::Duration) {
        self.stop();
        std::thread::sleep(down);
        self.start_again();
    }

    /// The first half of [`Cluster::restart`]: `pg_ctl stop -m fast`, blocking until
    /// the server is down.
    pub(crate) fn stop(&self) {
        self.pg_ctl_stop("fast");
    }

    /// [`Cluster::stop`] without `pg_ctl`'s polling: the postmaster is sent SIGINT (the
    /// fast shutdown `-m fast` asks for: every session ends at once) and this returns
    /// as soon as its pid file is gone, in tens of milliseconds rather than `pg_ctl`'s
    /// tenths of a second. For a fault that must land before a client's time limit.
    pub(crate) fn stop_at_once(&self) {
        let pid_file = self.dir.join("postmaster.pid");
        let pid = std::fs::read_to_string(&pid_file).expect("the server's pid file");
        let pid = pid.lines().next().expect("the postmaster's pid").trim();
        let mut kill = Command::new("sh");
        kill.args(["-c", "kill -INT \"$0\"", pid]);
        run(kill, "kill -INT (the postmaster)");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while pid_file.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "the server did not stop within 60 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// The second half of [`Cluster::restart`]: start the server again, blocking until
    /// it accepts connections.
    pub(crate) fn start_again(&self) {
        self.pg_ctl_start();
    }

    /// Where the server binaries (and `psql`) are.
    pub(crate) fn bin(&self) -> &Path {
        &self.bin
    }

    /// The loopback port the server listens on.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// The URL of database `name` on this cluster.
    pub(crate) fn url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// Create a fresh, empty database; its URL.
    pub(crate) fn create_database(&self) -> String {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!("lull_{}", NEXT.fetch_add(1, Ordering::SeqCst));
        let mut createdb = Command::new(self.bin.join("createdb"));
        createdb
            .args(["-h", "127.0.0.1", "-U", "postgres", "-p"])
            .arg(self.port.to_string())
            .arg(&name);
        run(createdb, "createdb");
        self.url(&name)
    }

    /// The server's log so far (for a failing test's message).
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }
}

/// A private cluster stops with its owner (the shared one, a static, never drops: its
/// watchdog stops it with the test process).
impl Drop for Cluster {
    fn drop(&mut self) {
        let mut stop = server_command(&self.bin, "pg_ctl", self.root);
        stop.arg("-D")
            .arg(&self.dir)
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let _ = stop.status();
    }
}

/// The timer announcements (`NOTIFY lull_armed`) committed on a database, read on a
/// `LISTEN` session of the test's own, in commit order: what a replica's listener
/// would be told, without the timing of a wake-up.
pub(crate) struct Announcements {
    client: tokio_postgres::Client,
    heard: tokio::sync::mpsc::UnboundedReceiver<(String, String)>,
    probes: u64,
}

impl Announcements {
    pub(crate) async fn listen(url: &str) -> Announcements {
        let (client, mut connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("a LISTEN session");
        let (tx, heard) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(message)) = futures_util::StreamExt::next(&mut messages).await {
                if let tokio_postgres::AsyncMessage::Notification(n) = message {
                    let _ = tx.send((n.channel().to_owned(), n.payload().to_owned()));
                }
            }
        });
        client
            .batch_execute("LISTEN lull_armed; LISTEN lull_test_probe")
            .await
            .expect("LISTEN");
        Announcements {
            client,
            heard,
            probes: 0,
        }
    }

    /// The platforms announced since the last call: a probe is notified and the
    /// announcements read up to it. Notifications reach a listener in the order their
    /// transactions committed, so every announcement committed before this call is
    /// among them, and none committed after.
    pub(crate) async fn since_last(&mut self) -> Vec<String> {
        self.probes += 1;
        let probe = self.probes.to_string();
        self.client
            .execute("SELECT pg_notify('lull_test_probe', $1)", &[&probe])
            .await
            .expect("a probe");
        let mut announced = Vec::new();
        loop {
            let (channel, payload) =
                tokio::time::timeout(std::time::Duration::from_secs(30), self.heard.recv())
                    .await
                    .expect("the probe comes back")
                    .expect("the LISTEN session is open");
            match channel.as_str() {
                "lull_test_probe" if payload == probe => return announced,
                "lull_armed" => announced.push(payload),
                _ => {}
            }
        }
    }
}

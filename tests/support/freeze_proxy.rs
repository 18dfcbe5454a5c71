//! A loopback TCP proxy that can go silent: it forwards between a local port and an
//! upstream address (a PostgreSQL server) and, when told to [`FreezeProxy::freeze`],
//! stops forwarding in both directions without closing anything. The sockets stay
//! open and the kernel keeps acknowledging what is sent to them, so a client sees no
//! reset and no error, only a peer that never answers: a network path that froze, a
//! host that hung. [`FreezeProxy::thaw`] forwards again, what waited included.
//!
//! It runs on threads of its own (blocking sockets), not on the test's runtime, so it
//! keeps forwarding while a test blocks its runtime, and serves real `lull` processes
//! as well as stores in the test process: point their `DATABASE_URL` at
//! [`FreezeProxy::url`]. Dropping it closes every connection.
//!
//! ```ignore
//! let proxy = FreezeProxy::start(upstream_addr);
//! let store = PostgresStore::open(&proxy.url(&database_url), …).await?;
//! proxy.freeze(); // every connection through it goes silent
//! proxy.thaw();   // and forwards again
//! ```

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// The proxy's state, shared with its threads.
#[derive(Default)]
struct Shared {
    /// Whether forwarding is stopped; pumps wait on `changed` while it is.
    frozen: Mutex<bool>,
    changed: Condvar,
    /// Set on drop: the threads end.
    stopped: AtomicBool,
    /// Every socket of every connection, to close them all on drop.
    sockets: Mutex<Vec<TcpStream>>,
    accepted: AtomicUsize,
}

impl Shared {
    /// Wait while frozen; `false` once the proxy is dropped.
    fn wait_until_flowing(&self) -> bool {
        let mut frozen = self.frozen.lock().unwrap();
        while *frozen && !self.stopped.load(Ordering::SeqCst) {
            frozen = self.changed.wait(frozen).unwrap();
        }
        !self.stopped.load(Ordering::SeqCst)
    }
}

/// A running proxy on `127.0.0.1`.
pub(crate) struct FreezeProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    shared: Arc<Shared>,
}

impl FreezeProxy {
    /// Listen on a free loopback port and forward every connection to `upstream`.
    pub(crate) fn start(upstream: SocketAddr) -> FreezeProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared::default());
        let accepting = shared.clone();
        std::thread::Builder::new()
            .name("freeze-proxy".into())
            .spawn(move || accept(listener, upstream, accepting))
            .expect("start the proxy");
        FreezeProxy {
            addr,
            upstream,
            shared,
        }
    }

    /// A proxy in front of the server of a `postgres://` URL (its host and port).
    pub(crate) fn for_postgres(url: &str) -> FreezeProxy {
        let parsed = url::Url::parse(url).expect("a postgres:// URL");
        let host = parsed.host_str().expect("a host");
        let port = parsed.port().unwrap_or(5432);
        let upstream = std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
            .expect("resolve the server")
            .next()
            .expect("an address of the server");
        FreezeProxy::start(upstream)
    }

    /// The proxy's address (connect here instead of upstream).
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where it forwards to.
    pub(crate) fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// `url` (a `postgres://` URL of the upstream server) through the proxy: the
    /// same user, database and parameters, the proxy's host and port.
    pub(crate) fn url(&self, url: &str) -> String {
        let mut parsed = url::Url::parse(url).expect("a postgres:// URL");
        parsed
            .set_host(Some(&self.addr.ip().to_string()))
            .expect("set the host");
        parsed
            .set_port(Some(self.addr.port()))
            .expect("set the port");
        parsed.to_string()
    }

    /// Stop forwarding, in both directions, on every connection (open now or later);
    /// nothing is closed.
    pub(crate) fn freeze(&self) {
        *self.shared.frozen.lock().unwrap() = true;
        self.shared.changed.notify_all();
    }

    /// Forward again, what waited while frozen first.
    pub(crate) fn thaw(&self) {
        *self.shared.frozen.lock().unwrap() = false;
        self.shared.changed.notify_all();
    }

    pub(crate) fn is_frozen(&self) -> bool {
        *self.shared.frozen.lock().unwrap()
    }

    /// Connections accepted so far.
    pub(crate) fn connections(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for FreezeProxy {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        self.shared.changed.notify_all();
        for socket in self.shared.sockets.lock().unwrap().drain(..) {
            let _ = socket.shutdown(Shutdown::Both);
        }
        // Wake the accepting thread, which then sees `stopped`.
        let _ = TcpStream::connect(self.addr);
    }
}

fn accept(listener: TcpListener, upstream: SocketAddr, shared: Arc<Shared>) {
    for client in listener.incoming() {
        if shared.stopped.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        let Ok(server) = TcpStream::connect(upstream) else {
            continue;
        };
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        {
            let mut sockets = shared.sockets.lock().unwrap();
            sockets.push(client.try_clone().unwrap());
            sockets.push(server.try_clone().unwrap());
        }
        for (from, to) in [
            (client.try_clone().unwrap(), server.try_clone().unwrap()),
            (server, client),
        ] {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("freeze-proxy-pump".into())
                .spawn(move || pump(from, to, &shared))
                .expect("start a pump");
        }
    }
}

/// Copy `from` to `to` while not frozen. A chunk read just before a freeze waits,
/// unsent, until the thaw. The end of either side ends both.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: &Shared) {
    let mut buffer = [0u8; 16 * 1024];
    loop {
        if !shared.wait_until_flowing() {
            return;
        }
        let n = match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !shared.wait_until_flowing() || to.write_all(&buffer[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

//! A loopback TCP relay to put between the host and sshd, so a test can drop the SSH connection
//! at a chosen point of a transfer, as a flaky network or a rebooted router would. The cut is
//! counted in bytes, not timed: "after N more bytes towards the server" lands mid-upload however
//! fast the machine is.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// No cut.
const NEVER: u64 = u64::MAX;

/// What the relay does, shared with its connections.
struct State {
    upstream: SocketAddr,
    /// Bytes towards the server a connection may carry after the last [`Relay::cut_after`]
    /// before it is cut; [`NEVER`] when passing everything.
    limit: AtomicU64,
    /// Bumped by every `cut_after`/`pass`, so each connection counts from then on.
    generation: AtomicU64,
    /// Connections cut so far; `watch` so a test can await the next one.
    cuts: watch::Sender<usize>,
    accepted: AtomicUsize,
}

/// A TCP relay on `127.0.0.1:PORT` to `upstream`. Stops (with every connection) when dropped.
pub struct Relay {
    addr: SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    pub async fn start(upstream: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            upstream,
            limit: AtomicU64::new(NEVER),
            generation: AtomicU64::new(0),
            cuts: watch::channel(0).0,
            accepted: AtomicUsize::new(0),
        });
        let shared = state.clone();
        let task = tokio::spawn(async move {
            // The JoinSet ends every connection when the relay is dropped (its task aborted).
            let mut connections = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((client, _)) = accepted else { continue };
                        shared.accepted.fetch_add(1, Ordering::Relaxed);
                        connections.spawn(pipe(client, shared.clone()));
                    }
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        Relay { addr, state, task }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// From now on, cuts every connection (open or new) once it has carried `bytes` more towards
    /// the server: both sockets are closed, as when the path to the server goes away.
    pub fn cut_after(&self, bytes: u64) {
        self.state.limit.store(bytes, Ordering::SeqCst);
        self.state.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Passes everything again (connections are counted from now on).
    pub fn pass(&self) {
        self.state.limit.store(NEVER, Ordering::SeqCst);
        self.state.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Connections cut so far.
    pub fn cuts(&self) -> usize {
        *self.state.cuts.borrow()
    }

    /// A receiver of the number of connections cut so far (to await the next cut).
    pub fn watch_cuts(&self) -> watch::Receiver<usize> {
        self.state.cuts.subscribe()
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.state.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies one connection both ways until either side ends or the cut comes; then both sockets
/// are dropped (closed) together.
async fn pipe(mut client: TcpStream, state: Arc<State>) {
    let Ok(mut server) = TcpStream::connect(state.upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.split();
    let (mut server_read, mut server_write) = server.split();
    let towards_server = async {
        let mut buffer = vec![0u8; 64 * 1024];
        let (mut generation, mut carried) = (state.generation.load(Ordering::SeqCst), 0u64);
        loop {
            let n = match client_read.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let now = state.generation.load(Ordering::SeqCst);
            if now != generation {
                (generation, carried) = (now, 0);
            }
            let limit = state.limit.load(Ordering::SeqCst);
            if carried + n as u64 >= limit {
                let keep = (limit - carried) as usize;
                let _ = server_write.write_all(&buffer[..keep]).await;
                state.cuts.send_modify(|cuts| *cuts += 1);
                return;
            }
            carried += n as u64;
            if server_write.write_all(&buffer[..n]).await.is_err() {
                return;
            }
        }
    };
    let towards_client = tokio::io::copy(&mut server_read, &mut client_write);
    tokio::select! {
        _ = towards_server => {}
        _ = towards_client => {}
    }
}

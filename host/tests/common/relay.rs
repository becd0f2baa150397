//! A loopback TCP relay to put between the host and sshd, so a test can drop the SSH connection
//! at a chosen point of a transfer, as a flaky network or a rebooted router would, or hold it
//! there while the test does something else (kills sshd's connection process). The point is
//! counted in bytes, not timed: "after N more bytes towards the server" lands mid-upload however
//! fast the machine is.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the relay does with each connection, counted from when the rule was set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    Pass,
    /// Close both sockets once the connection carried this many bytes towards the server.
    CutAfter(u64),
    /// Stop forwarding towards the server after this many bytes, until the rule changes.
    HoldAfter(u64),
}

/// What the relay does, shared with its connections.
struct State {
    upstream: SocketAddr,
    /// The rule and its generation (bumped at every change, so each connection counts anew).
    rule: watch::Sender<(u64, Rule)>,
    /// Connections cut so far, and held so far; `watch` so a test can await the next one.
    cuts: watch::Sender<usize>,
    holds: watch::Sender<usize>,
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
            rule: watch::channel((0, Rule::Pass)).0,
            cuts: watch::channel(0).0,
            holds: watch::channel(0).0,
        });
        let shared = state.clone();
        let task = tokio::spawn(async move {
            // The JoinSet ends every connection when the relay is dropped (its task aborted).
            let mut connections = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((client, _)) = accepted else { continue };
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

    fn set(&self, rule: Rule) {
        self.state
            .rule
            .send_modify(|(generation, old)| (*generation, *old) = (*generation + 1, rule));
    }

    /// From now on, cuts every connection (open or new) once it has carried `bytes` more towards
    /// the server: both sockets are closed, as when the path to the server goes away.
    pub fn cut_after(&self, bytes: u64) {
        self.set(Rule::CutAfter(bytes));
    }

    /// Cuts every open connection now, and every new one at its first byte, until the rule
    /// changes.
    pub fn cut_now(&self) {
        self.set(Rule::CutAfter(0));
    }

    /// Waits until `n` connections in all have been cut.
    pub async fn cut(&self, n: usize) {
        let mut cuts = self.state.cuts.subscribe();
        cuts.wait_for(|cut| *cut >= n)
            .await
            .expect("the relay runs");
    }

    /// From now on, stops forwarding a connection towards the server once it has carried
    /// `bytes` more, until [`Relay::pass`]; the other direction still flows.
    pub fn hold_after(&self, bytes: u64) {
        self.set(Rule::HoldAfter(bytes));
    }

    /// Passes everything again (held connections go on).
    pub fn pass(&self) {
        self.set(Rule::Pass);
    }

    /// Connections cut so far.
    pub fn cuts(&self) -> usize {
        *self.state.cuts.borrow()
    }

    /// Waits until `n` connections in all have been held.
    pub async fn held(&self, n: usize) {
        let mut holds = self.state.holds.subscribe();
        holds
            .wait_for(|held| *held >= n)
            .await
            .expect("the relay runs");
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
        let mut rules = state.rule.subscribe();
        let mut buffer = vec![0u8; 64 * 1024];
        let (mut generation, mut carried) = (rules.borrow().0, 0u64);
        loop {
            let n = tokio::select! {
                read = client_read.read(&mut buffer) => match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                },
                // A new rule applies at once to a quiet connection too (`cut_now`).
                changed = rules.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let (now, rule) = *rules.borrow_and_update();
                    if now != generation {
                        (generation, carried) = (now, 0);
                    }
                    if rule == Rule::CutAfter(0) {
                        state.cuts.send_modify(|cuts| *cuts += 1);
                        return;
                    }
                    continue;
                }
            };
            let mut chunk = &buffer[..n];
            while !chunk.is_empty() {
                let (now, rule) = *rules.borrow_and_update();
                if now != generation {
                    (generation, carried) = (now, 0);
                }
                let limit = match rule {
                    Rule::Pass => u64::MAX,
                    Rule::CutAfter(limit) | Rule::HoldAfter(limit) => limit,
                };
                let room = limit.saturating_sub(carried).min(chunk.len() as u64) as usize;
                if server_write.write_all(&chunk[..room]).await.is_err() {
                    return;
                }
                (carried, chunk) = (carried + room as u64, &chunk[room..]);
                if chunk.is_empty() && carried < limit {
                    break;
                }
                match rule {
                    Rule::Pass => {}
                    Rule::CutAfter(_) => {
                        state.cuts.send_modify(|cuts| *cuts += 1);
                        return;
                    }
                    Rule::HoldAfter(_) => {
                        state.holds.send_modify(|holds| *holds += 1);
                        if rules.changed().await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    };
    let towards_client = tokio::io::copy(&mut server_read, &mut client_write);
    tokio::select! {
        _ = towards_server => {}
        _ = towards_client => {}
    }
}

//! A loopback TCP relay a test can turn into a black hole (see `relay.rs` for one that cuts or
//! holds a connection after a number of bytes): connections are still accepted, but
//! nothing passes in either direction, as in a network partition where packets are dropped
//! (no reset, no refusal: the client's requests just never get an answer).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub struct BlackHole {
    pub addr: SocketAddr,
    blackhole: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl BlackHole {
    pub async fn start(target: SocketAddr) -> BlackHole {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let blackhole = Arc::new(AtomicBool::new(false));
        let hole = blackhole.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let hole = hole.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else {
                        return;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::join!(
                        pipe(client_read, server_write, hole.clone()),
                        pipe(server_read, client_write, hole),
                    );
                });
            }
        });
        BlackHole {
            addr,
            blackhole,
            task,
        }
    }

    /// From now on every byte is dropped, on open connections and new ones.
    pub fn cut(&self) {
        self.blackhole.store(true, Ordering::SeqCst);
    }

    /// Bytes pass again (on connections opened from now on; the old ones lost bytes, so a
    /// client has to give them up, as after a real partition).
    pub fn heal(&self) {
        self.blackhole.store(false, Ordering::SeqCst);
    }
}

impl Drop for BlackHole {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    blackhole: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut lost = false;
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        lost |= blackhole.load(Ordering::SeqCst);
        // A connection that lost bytes stays dead: forwarding the rest would corrupt the stream.
        if lost {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    if !lost {
        let _ = to.shutdown().await;
    }
}

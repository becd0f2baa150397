//! Minimal HTTP on loopback: a plain GET for health checks, and a file server
//! that serves fixed bytes at paths and counts requests (e.g. base images for
//! the KVM provider's download-and-verify path).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// `GET path` over plain HTTP/1.0; returns status and body. 5 s timeout.
pub async fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut buf = Vec::new();
        stream.read_to_end(&mut buf).await?;
        anyhow::Ok(buf)
    };
    let buf = tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .with_context(|| format!("GET http://{addr}{path}: timed out"))?
        .with_context(|| format!("GET http://{addr}{path}"))?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("GET http://{addr}{path}: bad response {head:?}"))?;
    Ok((status, body.to_owned()))
}

/// What a path serves: bytes in memory, or a file streamed from disk (guest images are too big
/// to hold in memory).
#[derive(Clone)]
enum Body {
    Bytes(Arc<Vec<u8>>),
    File(PathBuf),
}

#[derive(Default)]
struct Files {
    bodies: HashMap<String, Body>,
    hits: HashMap<String, usize>,
}

/// A loopback HTTP/1.1 server for fixed content (GET and HEAD, one request per
/// connection). Unknown paths answer 404. Runs on the tokio runtime that
/// started it; stops when dropped.
pub struct FileServer {
    addr: SocketAddr,
    files: Arc<Mutex<Files>>,
    task: tokio::task::JoinHandle<()>,
}

impl FileServer {
    pub async fn start() -> Result<FileServer> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("bind 127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let files = Arc::new(Mutex::new(Files::default()));
        let shared = files.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let files = shared.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve(stream, files).await {
                        tracing::debug!("file server: {e:#}");
                    }
                });
            }
        });
        Ok(FileServer { addr, files, task })
    }

    /// Serves `body` at `path` (which starts with `/`), replacing what was there.
    pub fn serve(&self, path: &str, body: impl Into<Vec<u8>>) {
        self.files
            .lock()
            .unwrap()
            .bodies
            .insert(path.to_owned(), Body::Bytes(Arc::new(body.into())));
    }

    /// Serves the file at `file` at `path`, read from disk at each request.
    pub fn serve_file(&self, path: &str, file: impl Into<PathBuf>) {
        self.files
            .lock()
            .unwrap()
            .bodies
            .insert(path.to_owned(), Body::File(file.into()));
    }

    /// Stops serving `path` (404 from now on).
    pub fn remove(&self, path: &str) {
        self.files.lock().unwrap().bodies.remove(path);
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT/path`
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Requests seen for `path` (any method, found or not).
    pub fn requests(&self, path: &str) -> usize {
        self.files
            .lock()
            .unwrap()
            .hits
            .get(path)
            .copied()
            .unwrap_or(0)
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(stream: TcpStream, files: Arc<Mutex<Files>>) -> Result<()> {
    let mut reader = BufReader::new(stream);
    let mut request_line = String::new();
    reader.read_line(&mut request_line).await?;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).await? == 0 || header == "\r\n" || header == "\n" {
            break;
        }
    }
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let target = parts.next().unwrap_or_default();
    let path = target.split('?').next().unwrap_or_default().to_owned();
    let body = {
        let mut files = files.lock().unwrap();
        *files.hits.entry(path.clone()).or_default() += 1;
        files.bodies.get(&path).cloned()
    };
    let mut stream = reader.into_inner();
    let (status, body) = match (method.as_str(), body) {
        ("GET" | "HEAD", Some(body)) => ("200 OK", body),
        ("GET" | "HEAD", None) => (
            "404 Not Found",
            Body::Bytes(Arc::new(b"not found\n".to_vec())),
        ),
        _ => (
            "405 Method Not Allowed",
            Body::Bytes(Arc::new(b"method not allowed\n".to_vec())),
        ),
    };
    let (length, file) = match body {
        Body::Bytes(bytes) => (bytes.len() as u64, Err(bytes)),
        Body::File(path) => {
            let file = tokio::fs::File::open(&path)
                .await
                .with_context(|| format!("open {}", path.display()))?;
            (file.metadata().await?.len(), Ok(file))
        }
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {length}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await?;
    if method != "HEAD" {
        match file {
            Ok(mut file) => {
                tokio::io::copy(&mut file, &mut stream).await?;
            }
            Err(bytes) => stream.write_all(&bytes).await?,
        }
    }
    stream.shutdown().await?;
    Ok(())
}

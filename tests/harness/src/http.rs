//! Minimal HTTP on loopback: a plain GET for health checks (reqwest), and a file server (axum)
//! that serves fixed bytes at paths and counts requests (e.g. base images for the KVM provider's
//! download-and-verify path).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use axum::body::Body as ResponseBody;
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};

/// `GET path` over plain HTTP; returns status and body. 5 s timeout.
pub async fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let url = format!("http://{addr}{path}");
    let exchange = async {
        let client = reqwest::Client::builder().no_proxy().build()?;
        let response = client.get(&url).send().await?;
        let status = response.status().as_u16();
        anyhow::Ok((status, response.text().await?))
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .with_context(|| format!("GET {url}: timed out"))?
        .with_context(|| format!("GET {url}"))
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

/// A loopback HTTP/1.1 server for fixed content (GET and HEAD). Unknown paths answer 404, other
/// methods 405. Runs on the tokio runtime that started it; stops when dropped.
pub struct FileServer {
    addr: SocketAddr,
    files: Arc<Mutex<Files>>,
    task: tokio::task::JoinHandle<()>,
}

impl FileServer {
    pub async fn start() -> Result<FileServer> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("bind 127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let files = Arc::new(Mutex::new(Files::default()));
        let app = axum::Router::new()
            .fallback(serve)
            .with_state(files.clone());
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::debug!("file server: {e:#}");
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

/// Every request: counted by path (query aside), then answered from `files`.
async fn serve(State(files): State<Arc<Mutex<Files>>>, method: Method, uri: Uri) -> Response {
    let path = uri.path().to_owned();
    let body = {
        let mut files = files.lock().unwrap();
        *files.hits.entry(path.clone()).or_default() += 1;
        files.bodies.get(&path).cloned()
    };
    let (status, body) = match (method, body) {
        (Method::GET | Method::HEAD, Some(body)) => (StatusCode::OK, body),
        (Method::GET | Method::HEAD, None) => (
            StatusCode::NOT_FOUND,
            Body::Bytes(Arc::new(b"not found\n".to_vec())),
        ),
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            Body::Bytes(Arc::new(b"method not allowed\n".to_vec())),
        ),
    };
    // hyper leaves the body out of a HEAD answer and keeps the Content-Length set here.
    let (length, body) = match body {
        Body::Bytes(bytes) => (bytes.len() as u64, ResponseBody::from(bytes.to_vec())),
        Body::File(path) => match tokio::fs::File::open(&path).await {
            Ok(file) => match file.metadata().await {
                Ok(metadata) => (
                    metadata.len(),
                    ResponseBody::from_stream(tokio_util::io::ReaderStream::new(file)),
                ),
                Err(e) => return unreadable(&path, e),
            },
            Err(e) => return unreadable(&path, e),
        },
    };
    (
        status,
        [
            (header::CONTENT_LENGTH, length.to_string()),
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            // One request per connection, as before: nothing outlives a dropped server.
            (header::CONNECTION, "close".to_owned()),
        ],
        body,
    )
        .into_response()
}

/// A served file that cannot be read: the test set it up wrong.
fn unreadable(path: &std::path::Path, e: std::io::Error) -> Response {
    tracing::debug!("file server: open {}: {e}", path.display());
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("cannot read {}: {e}\n", path.display()),
    )
        .into_response()
}

//! `proxy-operator plugin dev-api`: the small instances API that `plugin new`'s provider talks
//! to, kept in memory on loopback. Plugins are stateless, so a provider needs somewhere to keep
//! its instances even offline; this is that somewhere while you develop, standing in for your
//! cloud's API (replace the calls in the generated `src/api.rs` with your cloud's).
//!
//! ```text
//! GET    /healthz          200 ok
//! PUT    /instances/{name} 201 created, 200 when it exists (idempotent by name)
//! GET    /instances/{name} 200 instance, 404
//! DELETE /instances/{name} 204, 404
//! GET    /instances        200 [instance]
//! ```
//! An instance is `{"name", "zone", "port", "labels": {…}, "status": "RUNNING", "address",
//! "createdAt"}`; the labels are the caller's, returned as given.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};

type Instances = Arc<Mutex<BTreeMap<String, Value>>>;

/// The API's routes over an empty set of instances.
pub fn router() -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/instances", get(list))
        .route("/instances/{name}", get(get_one).put(put).delete(delete))
        .with_state(Instances::default())
}

/// Listens on `listen` and serves until Ctrl-C; prints the base URL first, so a script can read
/// the port of `127.0.0.1:0`.
pub async fn serve(listen: SocketAddr) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen} (--listen)"))?;
    let addr = listener.local_addr()?;
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        writeln!(out, "dev API listening on http://{addr}")?;
        out.flush()?;
    }
    axum::serve(listener, router())
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .context("serving the dev API")
}

/// `plugin dev-api` as a command: serves until Ctrl-C.
pub async fn command(listen: SocketAddr) -> std::process::ExitCode {
    match serve(listen).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The stored instances; a poisoned lock (a handler panicked) still holds valid data.
fn lock(instances: &Instances) -> std::sync::MutexGuard<'_, BTreeMap<String, Value>> {
    instances.lock().unwrap_or_else(|e| e.into_inner())
}

async fn list(State(instances): State<Instances>) -> Json<Vec<Value>> {
    Json(lock(&instances).values().cloned().collect())
}

async fn get_one(
    State(instances): State<Instances>,
    Path(name): Path<String>,
) -> Result<Json<Value>, (StatusCode, Json<Value>)> {
    lock(&instances)
        .get(&name)
        .cloned()
        .map(Json)
        .ok_or_else(|| not_found(&name))
}

fn not_found(name: &str) -> (StatusCode, Json<Value>) {
    (
        StatusCode::NOT_FOUND,
        Json(json!({"error": format!("instance {name} not found")})),
    )
}

async fn put(
    State(instances): State<Instances>,
    Path(name): Path<String>,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let mut instances = lock(&instances);
    if let Some(existing) = instances.get(&name) {
        return (StatusCode::OK, Json(existing.clone()));
    }
    let created_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let instance = json!({
        "name": name,
        "zone": body["zone"],
        "port": body["port"],
        "labels": body["labels"],
        "status": "RUNNING",
        "address": "127.0.0.1",
        "createdAt": created_at,
    });
    instances.insert(name, instance.clone());
    (StatusCode::CREATED, Json(instance))
}

async fn delete(
    State(instances): State<Instances>,
    Path(name): Path<String>,
) -> Result<StatusCode, (StatusCode, Json<Value>)> {
    match lock(&instances).remove(&name) {
        Some(_) => Ok(StatusCode::NO_CONTENT),
        None => Err(not_found(&name)),
    }
}

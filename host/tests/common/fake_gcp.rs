//! A fake of the two Google APIs the gcp provider uses, on loopback: the OAuth 2.0 token endpoint
//! (JWT bearer flow) and the Compute Engine v1 instances, zones and zone operations. Nothing real
//! can run here, so this follows Google's documented shapes: resources with `kind`, `selfLink`
//! and `status`, `Operation` answers to insert and delete, list answers without `items` when
//! empty, and errors as `{"error": {"code", "message", "errors": [{"reason", …}], "status"}}`
//! with the documented reasons (`notFound`, `alreadyExists`, `quotaExceeded`, `required`).
//! A zone can be made unavailable (503 `backendError` to everything in it), and inserts can be
//! held: the VM is made, the answer waits (a client killed meanwhile never learns of it).
//! Zone operations are kept and listed (`filter=targetLink = "…"`); an insert can be accepted
//! and then fail as its operation (`DONE` with `error.errors[].code`, the VM never made), as
//! Google's do for an exhausted zone, a missing image or a missing permission. Lists are paged
//! (`maxResults`, `pageToken`, `nextPageToken`).
//!
//! It checks what the real ones check: the JWT's RS256 signature against the service account's
//! public key, its `aud` and scope, and a bearer token it issued on every Compute request.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use aws_lc_rs::signature::KeyPair;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use serde_json::{Value, json};

pub const PROJECT: &str = "crawl-proxies";
pub const CLIENT_EMAIL: &str = "proxy-operator@crawl-proxies.iam.gserviceaccount.com";

#[derive(Default)]
pub struct GcpState {
    /// `zone/name` → instance resource.
    pub instances: BTreeMap<String, Value>,
    pub tokens: HashSet<String>,
    pub token_requests: usize,
    /// Zones that exist.
    pub zones: Vec<String>,
    /// The next insert fails with this quota error.
    pub quota_exceeded: bool,
    /// Every insert fails with the quota error until this is cleared.
    pub quota_exhausted: bool,
    /// The external IP new instances get.
    pub nat_ip: String,
    /// Every `Authorization` header the Compute API saw.
    pub authorizations: Vec<String>,
    operations: usize,
    /// Every zone operation, as `zone/operation-N` → Operation resource.
    pub operation_log: BTreeMap<String, Value>,
    /// Inserts accepted and then failed with `(code, message)` as their operation's error.
    pub insert_fails_with: Option<(String, String)>,
    /// Insert requests seen.
    pub inserts: usize,
    /// Items per page of `instances.list` (0: Google's default, 500).
    pub page_size: usize,
    /// Zones that answer every request with 503 `backendError`, as a zone in an outage does.
    pub unavailable_zones: HashSet<String>,
}

pub struct FakeGcp {
    pub addr: SocketAddr,
    pub state: Arc<Mutex<GcpState>>,
    /// `true` while inserts hold their answer (see [`FakeGcp::hold_inserts`]).
    holding: Arc<tokio::sync::watch::Sender<bool>>,
    public_key: Vec<u8>,
    private_pem: String,
    _server: tokio::task::JoinHandle<()>,
}

struct Shared {
    state: Arc<Mutex<GcpState>>,
    holding: Arc<tokio::sync::watch::Sender<bool>>,
    public_key: Vec<u8>,
    /// `http://127.0.0.1:PORT`, the start of every link it answers with.
    base: String,
    token_uri: String,
}

impl FakeGcp {
    pub async fn start(zones: &[&str]) -> FakeGcp {
        let pair = aws_lc_rs::rsa::KeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa2048).unwrap();
        use aws_lc_rs::encoding::AsDer;
        let der: aws_lc_rs::encoding::Pkcs8V1Der = pair.as_der().unwrap();
        let private_pem = format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
            STANDARD.encode(der.as_ref())
        );
        let public_key = pair.public_key().as_ref().to_vec();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(GcpState {
            zones: zones.iter().map(|z| z.to_string()).collect(),
            nat_ip: "127.0.0.1".into(),
            ..GcpState::default()
        }));
        let holding = Arc::new(tokio::sync::watch::Sender::new(false));
        let shared = Arc::new(Shared {
            state: state.clone(),
            holding: holding.clone(),
            public_key: public_key.clone(),
            base: format!("http://{addr}"),
            token_uri: format!("http://{addr}/token"),
        });
        let base = "/compute/v1/projects/{project}/zones/{zone}";
        let app = Router::new()
            .route("/token", post(token))
            .route(base, get(zone))
            .route(&format!("{base}/instances"), get(list).post(insert))
            .route(
                &format!("{base}/instances/{{name}}"),
                get(get_instance).delete(delete),
            )
            .route(&format!("{base}/operations"), get(list_operations))
            .route(&format!("{base}/operations/{{operation}}"), get(operation))
            .with_state(shared);
        let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        FakeGcp {
            addr,
            state,
            holding,
            public_key,
            private_pem,
            _server: server,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A service-account key file as `gcloud iam service-accounts keys create` writes it, with
    /// this fake as its token endpoint.
    pub fn key_file_json(&self) -> String {
        json!({
            "type": "service_account",
            "project_id": PROJECT,
            "private_key_id": "0123456789abcdef",
            "private_key": self.private_pem,
            "client_email": CLIENT_EMAIL,
            "client_id": "1234567890",
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "token_uri": format!("{}/token", self.url()),
        })
        .to_string()
    }

    /// The public half of the service account's key (what Google keeps).
    pub fn public_key(&self) -> &[u8] {
        &self.public_key
    }

    pub fn with<T>(&self, f: impl FnOnce(&mut GcpState) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }

    /// Insert requests seen.
    pub fn inserts(&self) -> usize {
        self.with(|s| s.inserts)
    }

    /// From now on, inserts make their VM at once but hold their answer until
    /// [`FakeGcp::release_inserts`]: a client killed meanwhile never learns the VM exists.
    pub fn hold_inserts(&self) {
        self.holding.send_replace(true);
    }

    /// Answers the held inserts and holds no more.
    pub fn release_inserts(&self) {
        self.holding.send_replace(false);
    }
}

fn error(code: u16, reason: &str, message: String) -> Response {
    let status = match code {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        409 => "ALREADY_EXISTS",
        503 => "UNAVAILABLE",
        _ => "UNKNOWN",
    };
    (
        StatusCode::from_u16(code).unwrap(),
        Json(json!({"error": {
            "code": code,
            "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason}],
            "status": status,
        }})),
    )
        .into_response()
}

/// OAuth 2.0 token endpoint: the JWT bearer grant, checked like Google checks it.
async fn token(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let invalid = |why: &str| {
        (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "invalid_grant", "error_description": why})),
        )
            .into_response()
    };
    let form: BTreeMap<String, String> = url::form_urlencoded::parse(&body).into_owned().collect();
    if form.get("grant_type").map(String::as_str)
        != Some("urn:ietf:params:oauth:grant-type:jwt-bearer")
    {
        return invalid("unsupported grant_type");
    }
    let Some(assertion) = form.get("assertion") else {
        return invalid("missing assertion");
    };
    let parts: Vec<&str> = assertion.split('.').collect();
    if parts.len() != 3 {
        return invalid("malformed JWT");
    }
    let signature = URL_SAFE_NO_PAD.decode(parts[2]).unwrap_or_default();
    let public = aws_lc_rs::signature::UnparsedPublicKey::new(
        &aws_lc_rs::signature::RSA_PKCS1_2048_8192_SHA256,
        &shared.public_key,
    );
    if public
        .verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &signature)
        .is_err()
    {
        return invalid("Invalid JWT Signature.");
    }
    let claims: Value = URL_SAFE_NO_PAD
        .decode(parts[1])
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    if claims["aud"] != shared.token_uri.as_str() || claims["iss"] != CLIENT_EMAIL {
        return invalid("Invalid JWT: aud or iss");
    }
    if !claims["scope"]
        .as_str()
        .unwrap_or_default()
        .contains("https://www.googleapis.com/auth/cloud-platform")
    {
        return invalid("Invalid OAuth scope");
    }
    let mut state = shared.state.lock().unwrap();
    state.token_requests += 1;
    let token = format!("ya29.fake-{}", state.token_requests);
    state.tokens.insert(token.clone());
    Json(json!({"access_token": token, "expires_in": 3599, "token_type": "Bearer"})).into_response()
}

/// The checks every Compute request goes through: a token this fake issued, then an existing
/// project and zone. `Some` is the error answer.
fn refused(shared: &Shared, headers: &HeaderMap, project: &str, zone: &str) -> Option<Response> {
    authorized(shared, headers).or_else(|| check_zone(shared, project, zone))
}

fn authorized(shared: &Shared, headers: &HeaderMap) -> Option<Response> {
    let header = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let mut state = shared.state.lock().unwrap();
    state.authorizations.push(header.clone());
    match header.strip_prefix("Bearer ") {
        Some(token) if state.tokens.contains(token) => None,
        _ => Some(error(
            401,
            "required",
            "Request is missing required authentication credential. Expected OAuth 2 access token, login cookie or other valid authentication credential.".into(),
        )),
    }
}

fn zone_link(base: &str, project: &str, zone: &str) -> String {
    format!("{base}/compute/v1/projects/{project}/zones/{zone}")
}

fn check_zone(shared: &Shared, project: &str, zone: &str) -> Option<Response> {
    if project != PROJECT {
        return Some(error(
            404,
            "notFound",
            format!("The resource 'projects/{project}' was not found"),
        ));
    }
    if shared
        .state
        .lock()
        .unwrap()
        .unavailable_zones
        .contains(zone)
    {
        return Some(error(
            503,
            "backendError",
            "The service is currently unavailable.".into(),
        ));
    }
    if !shared.state.lock().unwrap().zones.iter().any(|z| z == zone) {
        return Some(error(
            404,
            "notFound",
            format!("The resource 'projects/{project}/zones/{zone}' was not found"),
        ));
    }
    None
}

async fn zone(
    State(shared): State<Arc<Shared>>,
    Path((project, zone)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Some(e) = refused(&shared, &headers, &project, &zone) {
        return e;
    }
    Json(json!({"kind": "compute#zone", "name": zone, "status": "UP"})).into_response()
}

fn operation_for(
    state: &mut GcpState,
    base: &str,
    project: &str,
    zone: &str,
    kind: &str,
    target: &str,
) -> Value {
    state.operations += 1;
    let name = format!("operation-{}", state.operations);
    json!({
        "kind": "compute#operation",
        "id": state.operations.to_string(),
        "name": name,
        "zone": zone_link(base, project, zone),
        "operationType": kind,
        "targetLink": target,
        "status": "RUNNING",
        "progress": 0,
        "insertTime": k8s_openapi::jiff::Timestamp::now().round(k8s_openapi::jiff::Unit::Second).unwrap().to_string(),
        "selfLink": format!("{}/operations/{name}", zone_link(base, project, zone)),
    })
}

async fn insert(
    State(shared): State<Arc<Shared>>,
    Path((project, zone)): Path<(String, String)>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    // Read before the VM is made: a release that comes after it is seen by `wait_for`.
    let mut holding = shared.holding.subscribe();
    let answer = insert_now(&shared, &project, &zone, &headers, body);
    if answer.status().is_success() {
        let _ = holding.wait_for(|held| !*held).await;
    }
    answer
}

fn insert_now(
    shared: &Shared,
    project: &str,
    zone: &str,
    headers: &HeaderMap,
    mut body: Value,
) -> Response {
    let (project, zone) = (project.to_string(), zone.to_string());
    if let Some(e) = refused(shared, headers, &project, &zone) {
        return e;
    }
    let base = shared.base.clone();
    let Some(name) = body["name"].as_str().map(str::to_string) else {
        return error(
            400,
            "required",
            "Required field 'resource.name' not specified".into(),
        );
    };
    if body["machineType"].as_str().is_none()
        || body["disks"].as_array().is_none_or(|d| d.is_empty())
    {
        return error(
            400,
            "required",
            "Required field 'resource.machineType' or 'resource.disks' not specified".into(),
        );
    }
    let mut state = shared.state.lock().unwrap();
    state.inserts += 1;
    if std::mem::take(&mut state.quota_exceeded) || state.quota_exhausted {
        return error(
            403,
            "quotaExceeded",
            format!(
                "Quota 'CPUS' exceeded.  Limit: 8.0 in region {}.",
                &zone[..zone.len().saturating_sub(2)]
            ),
        );
    }
    let key = format!("{zone}/{name}");
    let self_link = format!("{}/instances/{name}", zone_link(&base, &project, &zone));
    if state.instances.contains_key(&key) {
        return error(
            409,
            "alreadyExists",
            format!(
                "The resource 'projects/{project}/zones/{zone}/instances/{name}' already exists"
            ),
        );
    }
    if let Some((code, message)) = state.insert_fails_with.clone() {
        // Accepted, then failed: the operation says why, and no VM is made.
        let mut op = operation_for(&mut state, &base, &project, &zone, "insert", &self_link);
        op["status"] = json!("DONE");
        op["progress"] = json!(100);
        op["error"] = json!({"errors": [{"code": code, "message": message}]});
        record(&mut state, &zone, &op);
        let mut answer = op;
        answer["status"] = json!("RUNNING");
        answer.as_object_mut().unwrap().remove("error");
        return Json(answer).into_response();
    }
    body["kind"] = json!("compute#instance");
    body["id"] = json!(format!(
        "{}",
        7_000_000_000_000_000_000u64 + state.instances.len() as u64
    ));
    body["status"] = json!("PROVISIONING");
    body["zone"] = json!(zone_link(&base, &project, &zone));
    body["selfLink"] = json!(self_link);
    body["creationTimestamp"] = json!("2026-11-30T11:22:33.123-08:00");
    let nat_ip = state.nat_ip.clone();
    if let Some(nics) = body["networkInterfaces"].as_array_mut() {
        for (i, nic) in nics.iter_mut().enumerate() {
            nic["networkIP"] = json!(format!("10.132.0.{}", 2 + i));
            nic["name"] = json!(format!("nic{i}"));
            if let Some(configs) = nic["accessConfigs"].as_array_mut() {
                for config in configs {
                    config["natIP"] = json!(nat_ip);
                    config["kind"] = json!("compute#accessConfig");
                }
            }
        }
    }
    state.instances.insert(key, body);
    let op = operation_for(&mut state, &base, &project, &zone, "insert", &self_link);
    let mut done = op.clone();
    done["status"] = json!("DONE");
    done["progress"] = json!(100);
    record(&mut state, &zone, &done);
    Json(op).into_response()
}

fn record(state: &mut GcpState, zone: &str, op: &Value) {
    let name = op["name"].as_str().unwrap_or_default();
    state
        .operation_log
        .insert(format!("{zone}/{name}"), op.clone());
}

/// `zoneOperations.list` with `filter=targetLink = "…"`.
async fn list_operations(
    State(shared): State<Arc<Shared>>,
    Path((project, zone)): Path<(String, String)>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    if let Some(e) = refused(&shared, &headers, &project, &zone) {
        return e;
    }
    let query: BTreeMap<String, String> =
        url::form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
    let target = query.get("filter").and_then(|f| {
        let (key, value) = f.split_once('=')?;
        (key.trim() == "targetLink").then(|| value.trim().trim_matches('"').to_string())
    });
    let state = shared.state.lock().unwrap();
    let items: Vec<&Value> = state
        .operation_log
        .iter()
        .filter(|(key, _)| key.starts_with(&format!("{zone}/")))
        .map(|(_, op)| op)
        .filter(|op| {
            target
                .as_ref()
                .is_none_or(|t| op["targetLink"] == t.as_str())
        })
        .collect();
    let mut answer = json!({"kind": "compute#operationList", "id": format!("projects/{project}/zones/{zone}/operations")});
    if !items.is_empty() {
        answer["items"] = json!(items);
    }
    Json(answer).into_response()
}

/// Each read moves a new instance one step on: PROVISIONING → STAGING → RUNNING.
async fn get_instance(
    State(shared): State<Arc<Shared>>,
    Path((project, zone, name)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Some(e) = refused(&shared, &headers, &project, &zone) {
        return e;
    }
    let mut state = shared.state.lock().unwrap();
    match state.instances.get_mut(&format!("{zone}/{name}")) {
        Some(instance) => {
            let shown = instance.clone();
            let next = match instance["status"].as_str() {
                Some("PROVISIONING") => "STAGING",
                Some("STAGING") | Some("RUNNING") => "RUNNING",
                Some(other) => other,
                None => "RUNNING",
            }
            .to_string();
            instance["status"] = json!(next);
            Json(shown).into_response()
        }
        None => error(
            404,
            "notFound",
            format!(
                "The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found"
            ),
        ),
    }
}

async fn delete(
    State(shared): State<Arc<Shared>>,
    Path((project, zone, name)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Some(e) = refused(&shared, &headers, &project, &zone) {
        return e;
    }
    let base = shared.base.clone();
    let mut state = shared.state.lock().unwrap();
    match state.instances.remove(&format!("{zone}/{name}")) {
        Some(instance) => {
            let link = instance["selfLink"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            Json(operation_for(
                &mut state, &base, &project, &zone, "delete", &link,
            ))
            .into_response()
        }
        None => error(
            404,
            "notFound",
            format!(
                "The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found"
            ),
        ),
    }
}

/// `filter` supports what the provider sends: `labels.KEY = "VALUE"` (or without quotes).
async fn list(
    State(shared): State<Arc<Shared>>,
    Path((project, zone)): Path<(String, String)>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let query: BTreeMap<String, String> =
        url::form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
    if let Some(e) = refused(&shared, &headers, &project, &zone) {
        return e;
    }
    let filter = query.get("filter").and_then(|f| {
        let (key, value) = f.split_once('=')?;
        Some((
            key.trim().strip_prefix("labels.")?.to_string(),
            value.trim().trim_matches('"').to_string(),
        ))
    });
    let state = shared.state.lock().unwrap();
    let items: Vec<&Value> = state
        .instances
        .iter()
        .filter(|(key, _)| key.starts_with(&format!("{zone}/")))
        .map(|(_, i)| i)
        .filter(|i| {
            filter
                .as_ref()
                .is_none_or(|(k, v)| i["labels"][k] == v.as_str())
        })
        .collect();
    let mut answer = json!({"kind": "compute#instanceList", "id": format!("projects/{project}/zones/{zone}/instances")});
    // One page: `pageToken` is the index of its first item here (opaque to the client).
    let size = match (query.get("maxResults"), state.page_size) {
        (Some(n), _) => n.parse().unwrap_or(500),
        (None, 0) => 500,
        (None, n) => n,
    };
    let start: usize = query
        .get("pageToken")
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    let page: Vec<&Value> = items.iter().skip(start).take(size).copied().collect();
    if start + size < items.len() {
        answer["nextPageToken"] = json!((start + size).to_string());
    }
    // Google leaves `items` out of an empty list.
    if !page.is_empty() {
        answer["items"] = json!(page);
    }
    Json(answer).into_response()
}

async fn operation(
    State(shared): State<Arc<Shared>>,
    Path((project, zone, operation)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Some(e) = refused(&shared, &headers, &project, &zone) {
        return e;
    }
    Json(json!({"kind": "compute#operation", "name": operation, "status": "DONE", "progress": 100}))
        .into_response()
}

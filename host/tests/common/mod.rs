//! Shared pieces of the host's integration tests: where the built plugins are, and a small
//! loopback HTTP server that keeps the test provider's instances (plugins are stateless).

#![allow(dead_code)]

pub mod black_hole;
pub mod fake_gcp;
pub mod operator_process;
pub mod own_network;
pub mod relay;
pub mod test_ca;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::{Json, Router};
use proxy_operator::provider::capabilities::Grants;
use proxy_operator::provider::plugins::types::{InstanceSpec, Owner};
use proxy_operator::provider::plugins::{
    EngineOptions, LoadedPlugin, PluginEngine, ProviderInstance, ProviderInstanceOptions,
};

/// Where `make plugins` puts the provider components.
pub fn plugins_dir() -> PathBuf {
    std::env::var_os("PROXY_OPERATOR_PLUGINS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/plugins"))
}

/// A built plugin; a missing one fails the test with the command that builds it.
pub fn plugin_path(provider_type: &str) -> PathBuf {
    let path = plugins_dir().join(format!("{provider_type}.wasm"));
    assert!(
        path.exists(),
        "{} is missing: build the plugins with `make plugins` (or run the tests with `make test`)",
        path.display()
    );
    path
}

pub fn plugin_bytes(provider_type: &str) -> Vec<u8> {
    std::fs::read(plugin_path(provider_type)).expect("reading the plugin")
}

/// Options for tests: a small pool, short limits so misbehaviour is caught quickly.
pub fn test_options() -> EngineOptions {
    EngineOptions {
        pool_instances: 16,
        memory_limit: 64 << 20,
        cpu_budget: Duration::from_millis(500),
        call_timeout: Duration::from_secs(10),
        cache_dir: None,
        ..EngineOptions::default()
    }
}

pub async fn engine_with(options: EngineOptions) -> (Arc<PluginEngine>, prometheus::Registry) {
    let registry = prometheus::Registry::new();
    let engine = PluginEngine::new(options, &registry).expect("engine");
    (engine, registry)
}

pub async fn load_test_plugin(engine: &Arc<PluginEngine>) -> Arc<LoadedPlugin> {
    engine
        .load("test.wasm", plugin_bytes("test"))
        .await
        .expect("the test plugin loads")
}

/// A provider instance of the test plugin backed by `store`, granted only the store's address.
pub fn instance_for(
    engine: &Arc<PluginEngine>,
    plugin: &Arc<LoadedPlugin>,
    store: &InstanceStore,
    max_concurrent_calls: usize,
) -> ProviderInstance {
    let grants: Grants = serde_json::from_value(serde_json::json!({
        "http": { "allow": [format!("http://{}", store.addr)] }
    }))
    .unwrap();
    ProviderInstance::new(
        engine.clone(),
        "test-store",
        plugin.clone(),
        &serde_json::json!({ "endpoint": store.url() }),
        &grants.validate().unwrap(),
        ProviderInstanceOptions {
            max_concurrent_calls,
            upstream: None,
        },
    )
    .expect("valid grants")
}

pub fn spec(name: &str, options: serde_json::Value) -> InstanceSpec {
    InstanceSpec {
        name: name.to_string(),
        owner: Owner {
            namespace: "crawlers".into(),
            name: format!("proxy-{name}"),
            uid: format!("uid-{name}"),
            operator_id: "test-operator".into(),
        },
        zone: Some("zone-a".into()),
        image: None,
        machine_type: None,
        user_data: b"#cloud-config\n".to_vec(),
        vendor_data: Vec::new(),
        install_guest_agent: true,
        port: 3128,
        labels: Vec::new(),
        options,
        credentials: None,
    }
}

#[derive(Default)]
pub struct StoreState {
    pub instances: Mutex<HashMap<String, serde_json::Value>>,
    pub requests: AtomicUsize,
    /// `DELETE /instances/{id}` requests, found or not.
    pub deletes: AtomicUsize,
    /// `PUT /instances/{id}` requests: the test provider's creates.
    pub puts: AtomicUsize,
    pub in_flight: AtomicUsize,
    pub max_in_flight: AtomicUsize,
    /// Delay of every instance request, to hold calls open.
    pub delay: Mutex<Duration>,
    /// Headers of the requests to `/echo`.
    pub echo_headers: Mutex<Vec<HeaderMap>>,
    /// Answer every GET of an instance with 400 (a permanent error for the provider).
    pub fail_get: std::sync::atomic::AtomicBool,
    /// Extra delay of `GET /instances` only (the list).
    pub list_delay: Mutex<Duration>,
    /// Delay of `GET /healthz` (what the provider's check calls).
    pub health_delay: Mutex<Duration>,
    /// A create that completes at the provider this long after it was asked for, whether or
    /// not the caller is still waiting (a cloud finishing an insert after the client gave up).
    pub create_lag: Mutex<Duration>,
    /// Ports new instances take in turn (each a real squid) instead of the spec's, while any are
    /// left: each Proxy of a pool then has a proxy of its own.
    pub ports: Mutex<std::collections::VecDeque<u16>>,
    /// Every create is answered with this status and message instead (429: a provider out of
    /// quota, which the test provider reports as `quota`).
    pub refuse_creates: Mutex<Option<(u16, String)>>,
    /// Fields every new instance takes over the usual ones (a VM still booting:
    /// `{"state": "provisioning", "address": null, "message": "…"}`).
    pub new_instances: Mutex<Option<serde_json::Value>>,
}

/// The test provider's instance store on a loopback port.
pub struct InstanceStore {
    pub addr: SocketAddr,
    pub state: Arc<StoreState>,
    _server: tokio::task::JoinHandle<()>,
}

impl InstanceStore {
    pub async fn start() -> Self {
        let state = Arc::new(StoreState::default());
        let app = Router::new()
            .route("/healthz", get(healthz))
            .route("/echo", get(echo))
            .route("/instances", get(list))
            .route("/instances/{id}", get(get_one).put(put).delete(delete))
            .route(
                "/instances/{id}/credentials",
                axum::routing::put(put_credentials),
            )
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        InstanceStore {
            addr,
            state,
            _server: server,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Puts an instance into the store directly, as if made behind the operator's back.
    pub fn insert(&self, id: &str, owner: serde_json::Value, created_at: i64) {
        self.state.instances.lock().unwrap().insert(
            id.to_string(),
            serde_json::json!({
                "id": id, "name": id, "state": "running", "address": "127.0.0.1", "port": 3128,
                "zone": null, "createdAt": created_at, "owner": owner, "message": null,
            }),
        );
    }

    pub fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .state
            .instances
            .lock()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        ids.sort();
        ids
    }

    /// A providers-config entry of the test provider named `name`, keeping its instances here.
    pub fn provider_entry(&self, name: &str) -> String {
        format!(
            "- name: {name}\n  type: test\n  config: {{endpoint: \"{}\"}}\n  grants: {{http: {{allow: [\"http://{}\"]}}}}\n",
            self.url(),
            self.addr
        )
    }

    pub fn set_delay(&self, delay: Duration) {
        *self.state.delay.lock().unwrap() = delay;
    }
}

struct InFlight<'a>(&'a StoreState);
impl<'a> InFlight<'a> {
    fn enter(state: &'a StoreState) -> Self {
        state.requests.fetch_add(1, Ordering::SeqCst);
        let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        state.max_in_flight.fetch_max(now, Ordering::SeqCst);
        InFlight(state)
    }
}
impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn pause(state: &StoreState) {
    let delay = *state.delay.lock().unwrap();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
}

async fn echo(State(state): State<Arc<StoreState>>, headers: HeaderMap) -> Json<serde_json::Value> {
    let had_key = headers.contains_key("x-api-key");
    state.echo_headers.lock().unwrap().push(headers);
    // Says whether a key arrived, never the key itself.
    Json(serde_json::json!({ "receivedApiKey": had_key }))
}

async fn healthz(State(state): State<Arc<StoreState>>) -> &'static str {
    let delay = *state.health_delay.lock().unwrap();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    "ok"
}

async fn list(State(state): State<Arc<StoreState>>) -> Json<Vec<serde_json::Value>> {
    let _guard = InFlight::enter(&state);
    pause(&state).await;
    let delay = *state.list_delay.lock().unwrap();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    Json(state.instances.lock().unwrap().values().cloned().collect())
}

async fn get_one(
    State(state): State<Arc<StoreState>>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, StatusCode> {
    let _guard = InFlight::enter(&state);
    pause(&state).await;
    if state.fail_get.load(Ordering::SeqCst) {
        return Err(StatusCode::BAD_REQUEST);
    }
    state
        .instances
        .lock()
        .unwrap()
        .get(&id)
        .cloned()
        .map(Json)
        .ok_or(StatusCode::NOT_FOUND)
}

async fn put(
    State(state): State<Arc<StoreState>>,
    Path(id): Path<String>,
    Json(body): Json<serde_json::Value>,
) -> (StatusCode, Json<serde_json::Value>) {
    let _guard = InFlight::enter(&state);
    state.puts.fetch_add(1, Ordering::SeqCst);
    pause(&state).await;
    if let Some((status, message)) = state.refuse_creates.lock().unwrap().clone() {
        let status = StatusCode::from_u16(status).expect("a status code");
        return (status, Json(serde_json::json!({ "error": message })));
    }
    let lag = *state.create_lag.lock().unwrap();
    if !lag.is_zero() {
        // Stored by a task of its own, so it happens even if this request is given up.
        let (state, id, body) = (state.clone(), id.clone(), body.clone());
        let stored = tokio::spawn(async move {
            tokio::time::sleep(lag).await;
            store_instance(&state, id, &body)
        });
        return stored.await.expect("the store task");
    }
    store_instance(&state, id, &body)
}

fn store_instance(
    state: &StoreState,
    id: String,
    body: &serde_json::Value,
) -> (StatusCode, Json<serde_json::Value>) {
    let mut instances = state.instances.lock().unwrap();
    if let Some(existing) = instances.get(&id) {
        return (StatusCode::OK, Json(existing.clone()));
    }
    let port = match state.ports.lock().unwrap().pop_front() {
        Some(port) => serde_json::Value::from(port),
        None => body["port"].clone(),
    };
    let instance = serde_json::json!({
        "id": id,
        "name": body["name"],
        "state": "running",
        "address": "127.0.0.1",
        "port": port,
        "zone": body["zone"],
        "createdAt": 1_700_000_000,
        "owner": body["owner"],
        "message": null,
        "credentials": body["credentials"],
    });
    let mut instance = instance;
    if let Some(serde_json::Value::Object(fields)) = state.new_instances.lock().unwrap().clone() {
        for (field, value) in fields {
            instance[field] = value;
        }
    }
    instances.insert(id, instance.clone());
    (StatusCode::CREATED, Json(instance))
}

/// The test provider's `set-credentials`: the instance now requires these.
async fn put_credentials(
    State(state): State<Arc<StoreState>>,
    Path(id): Path<String>,
    Json(body): Json<serde_json::Value>,
) -> StatusCode {
    match state.instances.lock().unwrap().get_mut(&id) {
        Some(instance) => {
            instance["credentials"] = body;
            StatusCode::NO_CONTENT
        }
        None => StatusCode::NOT_FOUND,
    }
}

async fn delete(State(state): State<Arc<StoreState>>, Path(id): Path<String>) -> StatusCode {
    let _guard = InFlight::enter(&state);
    state.deletes.fetch_add(1, Ordering::SeqCst);
    pause(&state).await;
    match state.instances.lock().unwrap().remove(&id) {
        Some(_) => StatusCode::NO_CONTENT,
        None => StatusCode::NOT_FOUND,
    }
}

/// The harness sshd's client key and host key: what the `kvm-ssh` Secret holds for it.
pub fn ssh_material(
    sshd: &harness::Sshd,
) -> proxy_operator::provider::capabilities::libvirt::tunnel::SshMaterial {
    proxy_operator::provider::capabilities::libvirt::tunnel::SshMaterial {
        private_key: sshd.client_key_pem().into(),
        known_hosts: format!("{}\n", sshd.known_hosts_line()),
    }
}

/// Processes whose parent is `pid`.
pub fn children_of(pid: u32) -> Vec<libc::pid_t> {
    let mut children = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`; comm may hold spaces, so split after the last ')'.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let ppid = rest.split_whitespace().nth(1);
        if ppid == Some(&pid.to_string()) {
            children.push(head.split_whitespace().next().unwrap().parse().unwrap());
        }
    }
    children
}

/// Bytes that no compression could shrink (xorshift), so an upload really carries `len` bytes.
pub fn noise(len: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The `kvm-ssh` Secret with `material`, as an operator creates it.
pub fn ssh_secret(
    material: &proxy_operator::provider::capabilities::libvirt::tunnel::SshMaterial,
) -> k8s_openapi::api::core::v1::Secret {
    use k8s_openapi::ByteString;
    k8s_openapi::api::core::v1::Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("kvm-ssh".into()),
            ..Default::default()
        },
        data: Some(
            [
                (
                    "ssh-privatekey".to_string(),
                    ByteString(material.private_key.as_bytes().to_vec()),
                ),
                (
                    "known_hosts".to_string(),
                    ByteString(material.known_hosts.as_bytes().to_vec()),
                ),
            ]
            .into(),
        ),
        ..Default::default()
    }
}

/// Runs the conformance suite (the code path of `proxy-operator plugin test`) against a built
/// plugin, bound to `config` and `grants` in `engine`; fails the test naming every check that
/// did not pass.
pub async fn assert_conformant(
    engine: &Arc<PluginEngine>,
    plugin_type: &str,
    config: serde_json::Value,
    grants: Grants,
    spec: Option<InstanceSpec>,
) -> proxy_operator::provider::conformance::Report {
    let plugin = engine
        .load(&format!("{plugin_type}.wasm"), plugin_bytes(plugin_type))
        .await
        .expect("the plugin loads");
    let subject = proxy_operator::provider::conformance::Subject {
        engine: engine.clone(),
        name: format!("{plugin_type}-conformance"),
        plugin,
        config,
        grants: grants.validate().expect("valid grants"),
    };
    let spec = spec.unwrap_or_else(proxy_operator::provider::conformance::default_spec);
    let report = proxy_operator::provider::conformance::run(&subject, spec).await;
    assert!(
        report.passed,
        "{plugin_type} is not conformant:\n{}",
        report.lines().join("\n")
    );
    report
}

/// A Proxy of the test provider `store` whose "instance" is whatever listens on `port` (a real
/// squid, for the health engine to probe).
pub fn proxy_on_port(ns: &str, name: &str, port: u16) -> String {
    format!(
        "apiVersion: proxy-operator.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  provider: store\n  port: {port}\n"
    )
}

//! The test provider. Its instances live in a small HTTP server that the tests run (plugins are
//! stateless), reached through the host's `http` capability. `spec.options.misbehave` makes it
//! misbehave on purpose so the sandbox can be tested with a real component.
//!
//! An endpoint of `memory:N` serves N synthetic instances without any HTTP: the benchmark uses it
//! to measure the plugin call itself, and runs the same functions natively for the ratio. An
//! endpoint of `kube:` keeps each instance in a ConfigMap through the host's `kube` capability.

use proxy_operator_sdk::capabilities::{self, Level, kube};
use proxy_operator_sdk::{
    Capability, CheckTarget, Instance, InstanceSpec, InstanceState, Owner, PluginInfo, Provider,
    ProviderError, ProxyCredentials, export_provider,
};
use serde::{Deserialize, Serialize};

/// The provider instance config.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// `http://host:port` of the instance store, or `memory:N`.
    pub endpoint: String,
    /// Optional: fail `check` with this reason (tests of ProviderHealth).
    #[serde(default)]
    pub check_fails_with: Option<String>,
}

/// An instance as the store keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredInstance {
    pub id: String,
    pub name: String,
    pub state: String,
    pub address: Option<String>,
    pub port: u16,
    pub zone: Option<String>,
    pub created_at: Option<i64>,
    pub owner: Option<StoredOwner>,
    pub message: Option<String>,
    /// What the host sent for squid to check (tests read it to configure their squid): the
    /// user name and the password's hash, never the password.
    #[serde(default)]
    pub credentials: Option<StoredCredentials>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredCredentials {
    pub username: String,
    pub password_hash: String,
}

impl From<&ProxyCredentials> for StoredCredentials {
    fn from(c: &ProxyCredentials) -> Self {
        StoredCredentials {
            username: c.username.clone(),
            password_hash: c.password_hash.clone(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredOwner {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub operator_id: String,
}

pub struct TestProvider;

fn endpoint_kind(config: &Config) -> Result<Endpoint<'_>, ProviderError> {
    if let Some(n) = config.endpoint.strip_prefix("memory:") {
        let n = n.parse().map_err(|_| {
            ProviderError::InvalidConfig(format!(
                "config.endpoint: `{}` is not `memory:N` with N a number",
                config.endpoint
            ))
        })?;
        Ok(Endpoint::Memory(n))
    } else if config.endpoint == "kube:" {
        Ok(Endpoint::Kube)
    } else if config.endpoint.starts_with("http://") || config.endpoint.starts_with("https://") {
        Ok(Endpoint::Http(config.endpoint.trim_end_matches('/')))
    } else {
        Err(ProviderError::InvalidConfig(format!(
            "config.endpoint: `{}` must start with http://, https:// or memory:, or be kube:",
            config.endpoint
        )))
    }
}

enum Endpoint<'a> {
    Http(&'a str),
    Memory(usize),
    Kube,
}

/// The instance kept in a ConfigMap's `data.instance`.
fn from_configmap(object: &str) -> Result<StoredInstance, ProviderError> {
    let object: serde_json::Value = serde_json::from_str(object).map_err(|e| {
        ProviderError::Permanent(format!("the kube capability returned bad JSON: {e}"))
    })?;
    let data = object["data"]["instance"]
        .as_str()
        .ok_or_else(|| ProviderError::Permanent("ConfigMap without data.instance".into()))?;
    parse(data.as_bytes())
}

/// A synthetic instance, as `memory:` endpoints serve them. It was made by no operator, so it
/// carries no owner identity: the orphan GC leaves it alone (with an owner it took every synthetic
/// instance for the orphan of a Proxy that never existed).
pub fn synthetic(index: usize) -> StoredInstance {
    StoredInstance {
        id: format!("mem-{index}"),
        name: format!("px-{index:08x}"),
        state: "running".into(),
        address: Some(format!("10.0.{}.{}", index / 256, index % 256)),
        port: 3128,
        zone: Some("zone-a".into()),
        created_at: Some(1_700_000_000 + index as i64),
        owner: None,
        message: None,
        credentials: None,
    }
}

/// Converts a stored instance to the WIT record.
pub fn to_instance(stored: StoredInstance) -> Instance {
    let state = match stored.state.as_str() {
        "pending" => InstanceState::Pending,
        "provisioning" => InstanceState::Provisioning,
        "running" => InstanceState::Running,
        "stopping" => InstanceState::Stopping,
        "stopped" => InstanceState::Stopped,
        "failed" => InstanceState::Failed,
        _ => InstanceState::Unknown,
    };
    Instance {
        provider_id: stored.id,
        name: stored.name,
        state,
        address: stored.address,
        port: stored.port,
        zone: stored.zone,
        created_at: stored.created_at,
        owner: stored.owner.map(|o| Owner {
            namespace: o.namespace,
            name: o.name,
            uid: o.uid,
            operator_id: o.operator_id,
        }),
        message: stored.message,
    }
}

/// `get` against a `memory:N` endpoint (also run natively by the benchmark).
pub fn memory_get(n: usize, provider_id: &str) -> Result<Instance, ProviderError> {
    let index = provider_id
        .strip_prefix("mem-")
        .and_then(|i| i.parse::<usize>().ok())
        .filter(|i| *i < n)
        .ok_or_else(|| ProviderError::NotFound(format!("instance {provider_id} not found")))?;
    Ok(to_instance(synthetic(index)))
}

/// `list` against a `memory:N` endpoint (also run natively by the benchmark).
pub fn memory_list(n: usize) -> Vec<Instance> {
    (0..n).map(|i| to_instance(synthetic(i))).collect()
}

fn send(
    method: &str,
    url: &str,
    body: Option<&serde_json::Value>,
) -> Result<capabilities::Response, ProviderError> {
    Ok(capabilities::http_send(&capabilities::json_request(
        method, url, body,
    ))?)
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ProviderError> {
    serde_json::from_slice(body)
        .map_err(|e| ProviderError::Permanent(format!("instance store answered invalid JSON: {e}")))
}

/// Deliberate misbehaviour for sandbox tests, chosen by `spec.options.misbehave`.
fn misbehave(what: &str, config: &Config) -> Result<Instance, ProviderError> {
    match what {
        "loop" => {
            let mut x: u64 = 0;
            loop {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
        "alloc" => {
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                hoard.push(vec![1u8; 1 << 20]);
                std::hint::black_box(&hoard);
            }
        }
        "panic" => panic!("the test provider panics on request"),
        "introspect" => {
            // Everything the plugin can see of its environment, for the credential-isolation test.
            let seen = serde_json::json!({
                "env": std::env::vars().collect::<Vec<_>>(),
                "args": std::env::args().collect::<Vec<_>>(),
                "config": config.endpoint,
                "cwd": std::env::current_dir().ok().map(|p| p.display().to_string()),
                "rootListing": std::fs::read_dir("/").map(|d| d.count()).map_err(|e| e.to_string()),
            });
            let mut instance = to_instance(synthetic(0));
            instance.message = Some(seen.to_string());
            Ok(instance)
        }
        "echo" => {
            // Sends a request and reports the response, so a test can see what the plugin reads.
            let Endpoint::Http(base) = endpoint_kind(config)? else {
                return Err(ProviderError::Permanent(
                    "echo needs an http endpoint".into(),
                ));
            };
            let response = send("GET", &format!("{base}/echo"), None)?;
            let mut instance = to_instance(synthetic(0));
            instance.message = Some(
                serde_json::json!({
                    "status": response.status,
                    "headers": response.headers,
                    "body": String::from_utf8_lossy(&response.body),
                })
                .to_string(),
            );
            Ok(instance)
        }
        other => Err(ProviderError::Permanent(format!(
            "unknown misbehaviour `{other}`"
        ))),
    }
}

/// Sends an arbitrary GET (used by the grant tests: `spec.options.fetch`).
fn fetch(url: &str) -> Result<Instance, ProviderError> {
    let response = send("GET", url, None)?;
    let mut instance = to_instance(synthetic(0));
    instance.message = Some(format!("HTTP {}", response.status));
    Ok(instance)
}

impl Provider for TestProvider {
    type Config = Config;

    fn info() -> PluginInfo {
        PluginInfo {
            name: "test".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Test provider: instances in a loopback HTTP store".into(),
            capabilities: vec![Capability::Log, Capability::Http, Capability::Kube],
            config_schema: serde_json::json!({
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "required": ["endpoint"],
                "additionalProperties": false,
                "properties": {
                    "endpoint": {"type": "string", "description": "http(s)://host:port of the instance store, memory:N, or kube: (ConfigMaps)"},
                    "checkFailsWith": {"type": "string"}
                }
            })
            .to_string(),
        }
    }

    fn validate(config: &Config) -> Result<(), ProviderError> {
        endpoint_kind(config).map(|_| ())
    }

    fn create(config: Config, spec: InstanceSpec) -> Result<Instance, ProviderError> {
        let options: serde_json::Value = serde_json::from_str(&spec.options).unwrap_or_default();
        if let Some(what) = options.get("misbehave").and_then(|v| v.as_str()) {
            return misbehave(what, &config);
        }
        if let Some(url) = options.get("fetch").and_then(|v| v.as_str()) {
            return fetch(url);
        }
        // Kube grant tests: apply or read an arbitrary object and report what the host said.
        if let Some(object) = options.get("kubeApply") {
            let applied = kube::apply(&object.to_string())?;
            let mut instance = to_instance(synthetic(0));
            instance.message = Some(applied);
            return Ok(instance);
        }
        if let Some(target) = options.get("kubeGet") {
            let field = |f: &str| target[f].as_str().unwrap_or_default().to_string();
            let found = kube::get(&field("apiVersion"), &field("kind"), &field("name"))?;
            let mut instance = to_instance(synthetic(0));
            instance.message = Some(found);
            return Ok(instance);
        }
        match endpoint_kind(&config)? {
            Endpoint::Memory(_) => Ok(to_instance(synthetic(0))),
            Endpoint::Kube => {
                let stored = StoredInstance {
                    id: spec.name.clone(),
                    name: spec.name.clone(),
                    state: "running".into(),
                    address: Some("127.0.0.1".into()),
                    port: spec.port,
                    zone: spec.zone.clone(),
                    created_at: None,
                    owner: Some(StoredOwner {
                        namespace: spec.owner.namespace.clone(),
                        name: spec.owner.name.clone(),
                        uid: spec.owner.uid.clone(),
                        operator_id: spec.owner.operator_id.clone(),
                    }),
                    message: None,
                    credentials: spec.credentials.as_ref().map(Into::into),
                };
                let object = serde_json::json!({
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": spec.name},
                    "data": {"instance": serde_json::to_string(&stored).expect("serializable")},
                });
                let applied = kube::apply(&object.to_string())?;
                Ok(to_instance(from_configmap(&applied)?))
            }
            Endpoint::Http(base) => {
                capabilities::log(Level::Info, "creating instance", &[("name", &spec.name)]);
                let body = serde_json::json!({
                    "name": spec.name,
                    "zone": spec.zone,
                    "port": spec.port,
                    "userDataLen": spec.user_data.len(),
                    "owner": {
                        "namespace": spec.owner.namespace,
                        "name": spec.owner.name,
                        "uid": spec.owner.uid,
                        "operatorId": spec.owner.operator_id,
                    },
                    "options": options,
                    "credentials": spec.credentials.as_ref().map(StoredCredentials::from),
                });
                let response = send(
                    "PUT",
                    &format!("{base}/instances/{}", spec.name),
                    Some(&body),
                )?;
                match response.status {
                    200 | 201 => Ok(to_instance(parse(&response.body)?)),
                    status => Err(capabilities::status_error(status, &response.body)),
                }
            }
        }
    }

    fn get(config: Config, provider_id: String) -> Result<Instance, ProviderError> {
        match endpoint_kind(&config)? {
            Endpoint::Memory(n) => memory_get(n, &provider_id),
            Endpoint::Kube => {
                let object = kube::get("v1", "ConfigMap", &provider_id)?;
                Ok(to_instance(from_configmap(&object)?))
            }
            Endpoint::Http(base) => {
                let response = send("GET", &format!("{base}/instances/{provider_id}"), None)?;
                match response.status {
                    200 => Ok(to_instance(parse(&response.body)?)),
                    status => Err(capabilities::status_error(status, &response.body)),
                }
            }
        }
    }

    fn set_credentials(
        config: Config,
        provider_id: String,
        credentials: ProxyCredentials,
    ) -> Result<(), ProviderError> {
        let Endpoint::Http(base) = endpoint_kind(&config)? else {
            return Err(ProviderError::Permanent(
                "only the test provider's HTTP store keeps credentials".into(),
            ));
        };
        let body =
            serde_json::to_value(StoredCredentials::from(&credentials)).expect("serializable");
        let url = format!("{base}/instances/{provider_id}/credentials");
        let response = send("PUT", &url, Some(&body))?;
        match response.status {
            200 | 204 => Ok(()),
            status => Err(capabilities::status_error(status, &response.body)),
        }
    }

    fn delete(config: Config, provider_id: String) -> Result<(), ProviderError> {
        match endpoint_kind(&config)? {
            Endpoint::Memory(_) => Ok(()),
            Endpoint::Kube => capabilities::kube_delete_if_present("v1", "ConfigMap", &provider_id),
            Endpoint::Http(base) => {
                let response = send("DELETE", &format!("{base}/instances/{provider_id}"), None)?;
                match response.status {
                    200 | 204 | 404 => Ok(()),
                    status => Err(capabilities::status_error(status, &response.body)),
                }
            }
        }
    }

    fn list(config: Config) -> Result<Vec<Instance>, ProviderError> {
        match endpoint_kind(&config)? {
            Endpoint::Memory(n) => Ok(memory_list(n)),
            Endpoint::Kube => kube::list("v1", "ConfigMap", None)?
                .iter()
                .map(|o| from_configmap(o).map(to_instance))
                .collect(),
            Endpoint::Http(base) => {
                let response = send("GET", &format!("{base}/instances"), None)?;
                match response.status {
                    200 => {
                        let stored: Vec<StoredInstance> = parse(&response.body)?;
                        Ok(stored.into_iter().map(to_instance).collect())
                    }
                    status => Err(capabilities::status_error(status, &response.body)),
                }
            }
        }
    }

    fn check(config: Config) -> Result<Vec<CheckTarget>, ProviderError> {
        if let Some(reason) = config.check_fails_with {
            return Ok(vec![CheckTarget {
                target: "store".into(),
                ok: false,
                reason,
                message: "configured to fail".into(),
                latency_ms: 0,
            }]);
        }
        match endpoint_kind(&config)? {
            Endpoint::Kube => {
                let verdict = match kube::list("v1", "ConfigMap", None) {
                    Ok(_) => ("Ok".to_string(), true, String::new()),
                    Err(kube::KubeError::Denied(m)) => ("Forbidden".into(), false, m),
                    Err(e) => ("Unreachable".into(), false, format!("{e:?}")),
                };
                Ok(vec![CheckTarget {
                    target: "kube".into(),
                    ok: verdict.1,
                    reason: verdict.0,
                    message: verdict.2,
                    latency_ms: 0,
                }])
            }
            Endpoint::Memory(_) => Ok(vec![CheckTarget {
                target: "memory".into(),
                ok: true,
                reason: "Ok".into(),
                message: String::new(),
                latency_ms: 0,
            }]),
            Endpoint::Http(base) => {
                let verdict = match send("GET", &format!("{base}/healthz"), None) {
                    Ok(r) if r.status == 200 => ("Ok".to_string(), true, String::new()),
                    Ok(r) => ("Unreachable".into(), false, format!("HTTP {}", r.status)),
                    Err(ProviderError::Denied(m)) => ("Forbidden".into(), false, m),
                    Err(e) => ("Unreachable".into(), false, format!("{e:?}")),
                };
                Ok(vec![CheckTarget {
                    target: "store".into(),
                    ok: verdict.1,
                    reason: verdict.0,
                    message: verdict.2,
                    latency_ms: 0,
                }])
            }
        }
    }
}

export_provider!(TestProvider);

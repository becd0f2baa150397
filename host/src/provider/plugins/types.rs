//! Host-side types of the provider contract, independent of any one WIT version: every version's
//! bindings convert into these, so the rest of the operator never sees generated types.

use std::time::Duration;

/// Why a provider call failed, as the provider classified it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    #[error("not found: {0}")]
    NotFound(String),
    #[error("transient: {message}")]
    Transient {
        message: String,
        retry_after: Option<Duration>,
    },
    #[error("permanent: {0}")]
    Permanent(String),
    #[error("invalid config: {0}")]
    InvalidConfig(String),
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    #[error("quota: {0}")]
    Quota(String),
    #[error("denied: {0}")]
    Denied(String),
}

impl ProviderError {
    /// A bounded label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            ProviderError::NotFound(_) => "not_found",
            ProviderError::Transient { .. } => "transient",
            ProviderError::Permanent(_) => "permanent",
            ProviderError::InvalidConfig(_) => "invalid_config",
            ProviderError::Unauthorized(_) => "unauthorized",
            ProviderError::Quota(_) => "quota",
            ProviderError::Denied(_) => "denied",
        }
    }
}

/// The Proxy that owns an instance.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Owner {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub operator_id: String,
}

/// Given to a provider for a proxy's squid (WIT `proxy-credentials`); defined beside the login
/// it is hashed from.
pub use crate::provider::credentials::ProxyCredentials;

/// What the operator asks a provider to create.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceSpec {
    pub name: String,
    pub owner: Owner,
    #[serde(default)]
    pub zone: Option<String>,
    #[serde(default)]
    pub image: Option<String>,
    #[serde(default)]
    pub machine_type: Option<String>,
    #[serde(default, with = "bytes_as_text")]
    pub user_data: Vec<u8>,
    #[serde(default, with = "bytes_as_text")]
    pub vendor_data: Vec<u8>,
    #[serde(default = "default_true")]
    pub install_guest_agent: bool,
    #[serde(default = "default_port")]
    pub port: u16,
    #[serde(default)]
    pub labels: Vec<(String, String)>,
    /// A JSON object.
    #[serde(default = "empty_object")]
    pub options: serde_json::Value,
    /// The credentials squid must require; none for a proxy without them (and for providers
    /// built for WIT 0.1.0, which cannot carry them).
    #[serde(default)]
    pub credentials: Option<ProxyCredentials>,
}

fn default_true() -> bool {
    true
}
fn default_port() -> u16 {
    3128
}
fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(Default::default())
}

/// cloud-init is text in practice; spec files carry it as a string, the contract as bytes.
mod bytes_as_text {
    pub fn serialize<S: serde::Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&String::from_utf8_lossy(bytes))
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text: String = serde::Deserialize::deserialize(d)?;
        Ok(text.into_bytes())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum InstanceState {
    Pending,
    Provisioning,
    Running,
    Stopping,
    Stopped,
    Failed,
    Unknown,
}

/// An instance as the provider reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Instance {
    pub provider_id: String,
    pub name: String,
    pub state: InstanceState,
    pub address: Option<String>,
    pub port: u16,
    pub zone: Option<String>,
    pub created_at: Option<i64>,
    pub owner: Option<Owner>,
    pub message: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Capability {
    Log,
    Http,
    Kube,
    Libvirt,
}

/// What `describe` returns.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginInfo {
    pub name: String,
    pub version: String,
    pub description: String,
    pub capabilities: Vec<Capability>,
    pub config_schema: String,
}

/// One verdict of a provider health check.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckTarget {
    pub target: String,
    pub ok: bool,
    pub reason: String,
    pub message: String,
    pub latency_ms: u32,
}

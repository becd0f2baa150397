//! The provider instance config (`providers[].config` of a `kubernetes` provider instance) and
//! its checks beyond types; every message names the field and the fix.

use std::collections::BTreeMap;

use proxy_operator_sdk::ProviderError;
use proxy_operator_sdk::squid::{self, SquidOptions};
use serde::Deserialize;

/// The whole config of one `kubernetes` provider instance.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// The squid container image; pin a tag or digest.
    pub image: String,
    /// Client address ranges (CIDR) squid accepts.
    #[serde(default = "squid::default_allow_from")]
    pub allow_from: Vec<String>,
    /// Container resources.
    #[serde(default)]
    pub resources: Resources,
    /// `nodeSelector` of the Pods, e.g. to put proxies on nodes with public egress.
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    /// Where the image's squid reads its config; the provider mounts its squid.conf there.
    #[serde(default = "default_config_path")]
    pub config_path: String,
    /// Ports crawlers may `CONNECT` to (HTTPS); squid's safe default is 443 only.
    #[serde(default = "squid::default_connect_ports")]
    pub connect_ports: Vec<u16>,
    /// Destinations (CIDR) squid reaches although they are in the cluster or its network
    /// (`squid::REFUSED_DESTINATIONS`, `clusterRanges`), e.g. an in-cluster site to crawl.
    #[serde(default)]
    pub allow_destinations: Vec<String>,
    /// Destinations (CIDR) squid always refuses, even inside `allowDestinations`.
    #[serde(default)]
    pub deny_destinations: Vec<String>,
    /// The cluster's Service and Pod ranges, refused like the built-in ranges: needed where
    /// they lie outside the private and shared ranges squid refuses anyway. The provider cannot
    /// read them (they live in cluster-scoped objects its namespaced grant does not reach).
    #[serde(default)]
    pub cluster_ranges: Vec<String>,
    /// Keep squid's access log, in `/var/log/squid/access.log` of the Pod (an emptyDir). Off by
    /// default: a crawler's proxy logs every request.
    #[serde(default)]
    pub access_log: bool,
    /// The unprivileged user squid runs as: the host admits only Pods that run as non-root
    /// (the Pod Security "restricted" profile). 13 is `proxy` in Debian's and Ubuntu's squid.
    #[serde(default = "default_run_as_user")]
    pub run_as_user: u32,
    /// The Service in front of each proxy Pod; a Proxy may choose another in
    /// `spec.providerOptions.serviceType`.
    #[serde(default)]
    pub service_type: ServiceType,
    /// Which address a Proxy reports (and the operator probes and leases).
    #[serde(default)]
    pub address: AddressFrom,
}

/// `spec.type` of a proxy's Service.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum ServiceType {
    /// Crawlers in the cluster.
    #[default]
    ClusterIP,
    /// Crawlers outside the cluster, through a port on every node.
    NodePort,
    /// Crawlers outside the cluster, through the cloud's load balancer.
    LoadBalancer,
}

impl ServiceType {
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceType::ClusterIP => "ClusterIP",
            ServiceType::NodePort => "NodePort",
            ServiceType::LoadBalancer => "LoadBalancer",
        }
    }
}

/// Where a Proxy's address comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum AddressFrom {
    /// The Service: its load balancer's address once it has one (LoadBalancer), else its
    /// cluster IP. Stable while the Pod restarts.
    #[default]
    Service,
    /// The Pod's IP (no Service hop; for clusters where crawlers reach Pods directly).
    Pod,
}

/// What one Proxy may choose in `spec.providerOptions`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProxyOptions {
    pub service_type: Option<ServiceType>,
}

impl ProxyOptions {
    /// `spec.providerOptions` as the host passes it (JSON); errors name the field.
    pub fn parse(options: &str) -> Result<Self, ProviderError> {
        serde_json::from_str(options).map_err(|e| {
            ProviderError::InvalidConfig(format!(
                "spec.providerOptions: {e}; the kubernetes provider takes {{serviceType: ClusterIP|NodePort|LoadBalancer}}"
            ))
        })
    }
}

fn default_run_as_user() -> u32 {
    13
}

fn default_config_path() -> String {
    "/etc/squid/squid.conf".into()
}

impl Config {
    /// The squid settings, as every provider has them.
    pub fn squid(&self) -> SquidOptions {
        SquidOptions {
            allow_from: self.allow_from.clone(),
            connect_ports: self.connect_ports.clone(),
            allow_destinations: self.allow_destinations.clone(),
            deny_destinations: self.deny_destinations.clone(),
            cluster_ranges: self.cluster_ranges.clone(),
            access_log: self.access_log,
        }
    }
}

/// Requests and limits of the squid container (Kubernetes quantities).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Resources {
    #[serde(default = "default_cpu")]
    pub cpu: String,
    #[serde(default = "default_memory")]
    pub memory: String,
    #[serde(default = "default_memory_limit")]
    pub memory_limit: String,
}

impl Default for Resources {
    fn default() -> Self {
        Resources {
            cpu: default_cpu(),
            memory: default_memory(),
            memory_limit: default_memory_limit(),
        }
    }
}

fn default_cpu() -> String {
    "50m".into()
}
fn default_memory() -> String {
    "64Mi".into()
}
fn default_memory_limit() -> String {
    "256Mi".into()
}

/// The JSON Schema `describe` reports.
pub const SCHEMA: &str = include_str!("config.schema.json");

fn invalid(message: String) -> ProviderError {
    ProviderError::InvalidConfig(message)
}

/// Checks what the types cannot.
pub fn validate(config: &Config) -> Result<(), ProviderError> {
    if config.image.trim().is_empty() || config.image.contains(char::is_whitespace) {
        return Err(invalid(format!(
            "config.image: `{}` is not an image reference; e.g. docker.io/ubuntu/squid:6.6-24.04_beta (pin a tag or digest)",
            config.image
        )));
    }
    config.squid().validate()?;
    for (field, value) in [
        ("cpu", &config.resources.cpu),
        ("memory", &config.resources.memory),
        ("memoryLimit", &config.resources.memory_limit),
    ] {
        if !is_quantity(value) {
            return Err(invalid(format!(
                "config.resources.{field}: `{value}` is not a Kubernetes quantity like 50m, 64Mi or 1"
            )));
        }
    }
    if !config.config_path.starts_with('/') || config.config_path.ends_with('/') {
        return Err(invalid(format!(
            "config.configPath: `{}` must be an absolute file path, e.g. /etc/squid/squid.conf",
            config.config_path
        )));
    }
    if config.run_as_user == 0 {
        return Err(invalid(
            "config.runAsUser: 0 is root; the operator admits only Pods that run as non-root, e.g. 13 (proxy)".into(),
        ));
    }
    Ok(())
}

/// A plain Kubernetes quantity: digits with an optional fraction and suffix.
fn is_quantity(value: &str) -> bool {
    let number_end = value
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(value.len());
    let (number, suffix) = value.split_at(number_end);
    !number.is_empty()
        && number.parse::<f64>().is_ok()
        && matches!(
            suffix,
            "" | "m" | "k" | "M" | "G" | "T" | "Ki" | "Mi" | "Gi" | "Ti"
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(json: serde_json::Value) -> Config {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn defaults_are_private_ranges_and_small_resources() {
        let c = config(serde_json::json!({"image": "squid:6"}));
        assert_eq!(c.allow_from, squid::DEFAULT_ALLOW_FROM);
        assert_eq!(c.resources.memory_limit, "256Mi");
        assert_eq!(c.config_path, "/etc/squid/squid.conf");
        assert_eq!(c.connect_ports, [443]);
        validate(&c).unwrap();
    }

    #[test]
    fn errors_name_the_field_and_the_fix() {
        let error = |json: serde_json::Value| match validate(&config(json)) {
            Err(ProviderError::InvalidConfig(m)) => m,
            other => panic!("{other:?}"),
        };
        assert!(error(serde_json::json!({"image": " "})).starts_with("config.image:"));
        assert!(
            error(serde_json::json!({"image": "s", "allowFrom": []}))
                .starts_with("config.allowFrom: empty")
        );
        assert!(
            error(serde_json::json!({"image": "s", "allowFrom": ["10.0.0.0/8", "10.0.0.0"]}))
                .starts_with("config.allowFrom[1]:")
        );
        assert!(
            error(serde_json::json!({"image": "s", "allowFrom": ["0.0.0.0/0"]}))
                .contains("lets anyone use the proxy")
        );
        assert!(
            error(serde_json::json!({"image": "s", "resources": {"memory": "lots"}}))
                .starts_with("config.resources.memory:")
        );
        assert!(
            error(serde_json::json!({"image": "s", "configPath": "squid.conf"}))
                .starts_with("config.configPath:")
        );
        assert!(
            error(serde_json::json!({"image": "s", "runAsUser": 0}))
                .starts_with("config.runAsUser: 0 is root")
        );
        assert!(
            error(serde_json::json!({"image": "s", "connectPorts": [443, 0]}))
                .starts_with("config.connectPorts[1]:")
        );
        for field in ["allowDestinations", "denyDestinations", "clusterRanges"] {
            let message = error(serde_json::json!({"image": "s", field: ["10.1.2.3/8"]}));
            assert!(
                message.starts_with(&format!("config.{field}[0]: `10.1.2.3/8` has address bits")),
                "{message}"
            );
        }
    }

    #[test]
    fn quantities() {
        assert!(is_quantity("0.5") && is_quantity("128Mi") && is_quantity("100m"));
        assert!(!is_quantity("Mi") && !is_quantity("1 Gi"));
    }
}

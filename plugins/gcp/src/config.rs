//! The provider instance config (`providers[].config` of a `gcp` provider instance) and its
//! checks beyond types; every message names the field and the fix.

use proxy_operator_sdk::ProviderError;
use proxy_operator_sdk::squid::{self, SquidOptions};
use serde::Deserialize;

/// The Compute Engine API; tests point `apiBase` at a fake.
pub const DEFAULT_API_BASE: &str = "https://compute.googleapis.com";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// The project the VMs are made in.
    pub project: String,
    /// Zones a Proxy may ask for; the first is used when it asks for none.
    pub zones: Vec<String>,
    /// Machine type when the Proxy gives none.
    #[serde(default = "default_machine_type")]
    pub machine_type: String,
    /// Boot image when the Proxy gives none (a family or image URL).
    #[serde(default = "default_image")]
    pub image: String,
    #[serde(default = "default_disk_gib")]
    pub disk_gib: u32,
    /// The VPC network (`global/networks/NAME` or a full URL).
    #[serde(default = "default_network")]
    pub network: String,
    /// A subnetwork (`regions/REGION/subnetworks/NAME`), for custom-mode networks.
    #[serde(default)]
    pub subnetwork: Option<String>,
    /// Network tags, for the firewall rule that admits crawlers to the proxy port.
    #[serde(default = "default_tags")]
    pub network_tags: Vec<String>,
    /// Spot VMs: cheaper, may be preempted (the Proxy then reports the loss).
    #[serde(default)]
    pub spot: bool,
    #[serde(default = "default_api_base")]
    pub api_base: String,
    /// Configure squid on every VM (a startup script); a Proxy opts out with
    /// `providerOptions.managedSquid: false`.
    #[serde(default = "default_true")]
    pub managed_squid: bool,
    /// Client address ranges (CIDR) the managed squid accepts: the crawlers' and the operator's.
    #[serde(default = "squid::default_allow_from")]
    pub allow_from: Vec<String>,
    /// Ports crawlers may `CONNECT` to through the managed squid.
    #[serde(default = "squid::default_connect_ports")]
    pub connect_ports: Vec<u16>,
    /// Destinations (CIDR) the managed squid reaches although they are in its own network
    /// (`squid::REFUSED_DESTINATIONS`), e.g. an internal site the crawlers must fetch.
    #[serde(default)]
    pub allow_destinations: Vec<String>,
    /// Destinations (CIDR) the managed squid always refuses, even inside `allowDestinations`.
    #[serde(default)]
    pub deny_destinations: Vec<String>,
    /// Keep the managed squid's access log on the VM.
    #[serde(default)]
    pub access_log: bool,
}

impl Config {
    /// The managed squid's settings, as every provider has them.
    pub fn squid(&self) -> SquidOptions {
        SquidOptions {
            allow_from: self.allow_from.clone(),
            connect_ports: self.connect_ports.clone(),
            allow_destinations: self.allow_destinations.clone(),
            deny_destinations: self.deny_destinations.clone(),
            cluster_ranges: Vec::new(),
            access_log: self.access_log,
        }
    }
}

fn default_true() -> bool {
    true
}

fn default_machine_type() -> String {
    "e2-small".into()
}
fn default_image() -> String {
    "projects/debian-cloud/global/images/family/debian-12".into()
}
fn default_disk_gib() -> u32 {
    10
}
fn default_network() -> String {
    "global/networks/default".into()
}
fn default_tags() -> Vec<String> {
    vec!["proxy-operator".into()]
}
fn default_api_base() -> String {
    DEFAULT_API_BASE.into()
}

pub const SCHEMA: &str = include_str!("config.schema.json");

fn invalid(message: String) -> ProviderError {
    ProviderError::InvalidConfig(message)
}

/// Lowercase letters, digits and `-`, starting with a letter, at most `max` (GCE names).
pub fn is_gce_name(value: &str, max: usize) -> bool {
    !value.is_empty()
        && value.len() <= max
        && value.starts_with(|c: char| c.is_ascii_lowercase())
        && !value.ends_with('-')
        && value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

pub fn validate(config: &Config) -> Result<(), ProviderError> {
    config.squid().validate()?;
    // Project ids: 6-30 characters, lowercase letters, digits and hyphens.
    if config.project.len() < 6 || !is_gce_name(&config.project, 30) {
        return Err(invalid(format!(
            "config.project: `{}` is not a project id (6-30 lowercase letters, digits and '-', e.g. my-project-123)",
            config.project
        )));
    }
    if config.zones.is_empty() {
        return Err(invalid(
            "config.zones: empty; list the zones VMs may go to, e.g. [europe-west1-b]".into(),
        ));
    }
    for (index, zone) in config.zones.iter().enumerate() {
        if !is_gce_name(zone, 63) || zone.matches('-').count() < 2 {
            return Err(invalid(format!(
                "config.zones[{index}]: `{zone}` is not a zone like europe-west1-b"
            )));
        }
    }
    if !is_gce_name(&config.machine_type, 63) {
        return Err(invalid(format!(
            "config.machineType: `{}` is not a machine type like e2-small",
            config.machine_type
        )));
    }
    if config.disk_gib < 10 {
        return Err(invalid(format!(
            "config.diskGib: {} is below the 10 GiB the boot images need",
            config.disk_gib
        )));
    }
    for (index, tag) in config.network_tags.iter().enumerate() {
        if !is_gce_name(tag, 63) {
            return Err(invalid(format!(
                "config.networkTags[{index}]: `{tag}` is not a network tag (lowercase letters, digits and '-')"
            )));
        }
    }
    if !(config.api_base.starts_with("https://") || config.api_base.starts_with("http://")) {
        return Err(invalid(format!(
            "config.apiBase: `{}` is not an http(s) URL; leave it out for {DEFAULT_API_BASE}",
            config.api_base
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(json: serde_json::Value) -> Config {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn defaults_and_field_named_errors() {
        let ok =
            config(serde_json::json!({"project": "crawl-proxies", "zones": ["europe-west1-b"]}));
        validate(&ok).unwrap();
        assert_eq!(ok.machine_type, "e2-small");
        assert_eq!(ok.api_base, DEFAULT_API_BASE);
        let error = |json: serde_json::Value| match validate(&config(json)) {
            Err(ProviderError::InvalidConfig(m)) => m,
            other => panic!("{other:?}"),
        };
        assert!(
            error(serde_json::json!({"project": "Crawl", "zones": ["europe-west1-b"]}))
                .starts_with("config.project:")
        );
        assert!(
            error(serde_json::json!({"project": "crawl-proxies", "zones": []}))
                .starts_with("config.zones: empty")
        );
        assert!(
            error(serde_json::json!({"project": "crawl-proxies", "zones": ["europe"]}))
                .starts_with("config.zones[0]:")
        );
        assert!(error(serde_json::json!({"project": "crawl-proxies", "zones": ["europe-west1-b"], "diskGib": 5})).starts_with("config.diskGib:"));
        assert!(error(serde_json::json!({"project": "crawl-proxies", "zones": ["europe-west1-b"], "networkTags": ["Proxy"]})).starts_with("config.networkTags[0]:"));
    }
}

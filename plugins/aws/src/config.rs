//! The provider instance config (`providers[].config` of an `aws` provider instance) and its
//! checks beyond types; every message names the field and the fix.

use std::collections::BTreeMap;

use proxy_operator_sdk::ProviderError;
use proxy_operator_sdk::squid::{self, SquidOptions};
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// The region the instances are made in.
    pub region: String,
    /// The AMI of each region; `amis[region]` boots the instances a Proxy gives no image for.
    pub amis: BTreeMap<String, String>,
    /// Availability zones a Proxy may ask for; empty: any.
    #[serde(default)]
    pub zones: Vec<String>,
    #[serde(default = "default_instance_type")]
    pub instance_type: String,
    #[serde(default)]
    pub subnet_id: Option<String>,
    #[serde(default)]
    pub vpc_id: Option<String>,
    #[serde(default)]
    pub key_name: Option<String>,
    /// Spot instances: cheaper, may be interrupted (the Proxy then reports the loss).
    #[serde(default)]
    pub spot: bool,
    #[serde(default)]
    pub spot_max_price: Option<String>,
    /// The EC2 endpoint; tests point it at moto.
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default = "default_true")]
    pub managed_squid: bool,
    #[serde(default = "squid::default_allow_from")]
    pub allow_from: Vec<String>,
    #[serde(default = "squid::default_connect_ports")]
    pub connect_ports: Vec<u16>,
    #[serde(default)]
    pub allow_destinations: Vec<String>,
    #[serde(default)]
    pub deny_destinations: Vec<String>,
    #[serde(default)]
    pub access_log: bool,
    /// Instances a `DescribeInstances` page holds (`MaxResults`, 5-1000).
    #[serde(default = "default_page_size")]
    pub list_page_size: u32,
}

fn default_page_size() -> u32 {
    1000
}

fn default_true() -> bool {
    true
}

fn default_instance_type() -> String {
    "t3.micro".into()
}

pub const SCHEMA: &str = include_str!("config.schema.json");

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

    /// The EC2 Query API endpoint of the region (or the configured one), ending in `/`.
    pub fn endpoint(&self) -> String {
        let base = self
            .endpoint
            .clone()
            .unwrap_or_else(|| format!("https://ec2.{}.amazonaws.com", self.region));
        format!("{}/", base.trim_end_matches('/'))
    }

    /// The AMI for instances without an image of their own.
    pub fn ami(&self) -> &str {
        self.amis
            .get(&self.region)
            .map(String::as_str)
            .unwrap_or("")
    }
}

fn invalid(message: String) -> ProviderError {
    ProviderError::InvalidConfig(message)
}

/// Lowercase letters, digits and `-` (regions, zones).
fn is_aws_name(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= 64
        && value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// An EC2 resource id like `ami-0abc12`: `prefix-` then hex.
pub fn is_resource_id(value: &str, prefix: &str) -> bool {
    value.strip_prefix(prefix).is_some_and(|rest| {
        rest.strip_prefix('-').is_some_and(|hex| {
            (8..=17).contains(&hex.len()) && hex.chars().all(|c| c.is_ascii_hexdigit())
        })
    })
}

pub fn validate(config: &Config) -> Result<(), ProviderError> {
    config.squid().validate()?;
    if !is_aws_name(&config.region) || config.region.matches('-').count() < 2 {
        return Err(invalid(format!(
            "config.region: `{}` is not an AWS region like eu-west-1",
            config.region
        )));
    }
    for (region, ami) in &config.amis {
        if !is_resource_id(ami, "ami") {
            return Err(invalid(format!(
                "config.amis.{region}: `{ami}` is not an AMI id like ami-0123456789abcdef0"
            )));
        }
    }
    if config.ami().is_empty() {
        return Err(invalid(format!(
            "config.amis: no AMI for region {}; add `{}: ami-…` (a Debian or Ubuntu image with cloud-init)",
            config.region, config.region
        )));
    }
    for (index, zone) in config.zones.iter().enumerate() {
        if !is_aws_name(zone) || !zone.starts_with(&config.region) {
            return Err(invalid(format!(
                "config.zones[{index}]: `{zone}` is not an availability zone of {} like {}a",
                config.region, config.region
            )));
        }
    }
    let type_ok = config.instance_type.split_once('.').is_some_and(|(a, b)| {
        !a.is_empty()
            && !b.is_empty()
            && config
                .instance_type
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
    });
    if !type_ok {
        return Err(invalid(format!(
            "config.instanceType: `{}` is not an instance type like t3.micro",
            config.instance_type
        )));
    }
    for (field, value, prefix) in [
        ("subnetId", &config.subnet_id, "subnet"),
        ("vpcId", &config.vpc_id, "vpc"),
    ] {
        if let Some(id) = value
            && !is_resource_id(id, prefix)
        {
            return Err(invalid(format!(
                "config.{field}: `{id}` is not an id like {prefix}-0123456789abcdef0"
            )));
        }
    }
    if let Some(endpoint) = &config.endpoint
        && !(endpoint.starts_with("https://") || endpoint.starts_with("http://"))
    {
        return Err(invalid(format!(
            "config.endpoint: `{endpoint}` is not an http(s) URL; leave it out for https://ec2.{}.amazonaws.com",
            config.region
        )));
    }
    if !(5..=1000).contains(&config.list_page_size) {
        return Err(invalid(format!(
            "config.listPageSize: {} is not 5-1000 (EC2's MaxResults)",
            config.list_page_size
        )));
    }
    if config.spot_max_price.is_some() && !config.spot {
        return Err(invalid(
            "config.spotMaxPrice: set only with spot: true".into(),
        ));
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
        let ok = config(serde_json::json!({
            "region": "eu-west-1", "amis": {"eu-west-1": "ami-0123456789abcdef0"}
        }));
        validate(&ok).unwrap();
        assert_eq!(ok.instance_type, "t3.micro");
        assert_eq!(ok.endpoint(), "https://ec2.eu-west-1.amazonaws.com/");
        let error = |json: serde_json::Value| match validate(&config(json)) {
            Err(ProviderError::InvalidConfig(m)) => m,
            other => panic!("{other:?}"),
        };
        for (json, says) in [
            (
                serde_json::json!({"region": "Europe", "amis": {}}),
                "config.region:",
            ),
            (
                serde_json::json!({"region": "eu-west-1", "amis": {"us-east-1": "ami-0123456789abcdef0"}}),
                "config.amis: no AMI for region eu-west-1",
            ),
            (
                serde_json::json!({"region": "eu-west-1", "amis": {"eu-west-1": "debian"}}),
                "config.amis.eu-west-1:",
            ),
            (
                serde_json::json!({"region": "eu-west-1", "amis": {"eu-west-1": "ami-12c6146b"}, "zones": ["us-east-1a"]}),
                "config.zones[0]:",
            ),
            (
                serde_json::json!({"region": "eu-west-1", "amis": {"eu-west-1": "ami-12c6146b"}, "instanceType": "large"}),
                "config.instanceType:",
            ),
            (
                serde_json::json!({"region": "eu-west-1", "amis": {"eu-west-1": "ami-12c6146b"}, "subnetId": "vpc-12345678"}),
                "config.subnetId:",
            ),
        ] {
            let message = error(json);
            assert!(message.starts_with(says), "{message}");
        }
    }
}

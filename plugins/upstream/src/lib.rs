//! The `upstream` provider: proxies that exist already (bought from a vendor, run by another
//! team), made into Proxies that the operator probes, leases, pools, cools down and reports like
//! any other. It creates nothing: `create` hands a Proxy the upstream its `providerOptions.url`
//! names, or one of `config.upstreams` that no other Proxy holds, and records which in a
//! ConfigMap through the host's `kube` capability (plugins are stateless), so `get`, `list` and
//! `delete` find it again.
//!
//! An upstream's credentials never reach this plugin: the operator reads them from a mounted
//! Secret (the providers config's `upstream.credentials`), probes with them and hands them to the
//! gateway (and to a lease's `proxyUrl` only where allowed). A URL carrying a user name or a
//! password is refused.
//!
//! Everything that decides something is a plain function in `config` or `records` (tested
//! natively); this file only sequences the kube calls.

pub mod config;
pub mod records;

use proxy_operator_sdk::capabilities::{self, Level, kube};
use proxy_operator_sdk::{
    Capability, CheckTarget, Instance, InstanceSpec, InstanceState, PluginInfo, Provider,
    ProviderError, export_provider,
};

use crate::config::{Config, ProxyOptions, Upstream};
use crate::records::{Look, RECORD_SELECTOR, Record, Source};

/// The provider type in the providers config.
pub const PROVIDER_TYPE: &str = "upstream";

/// The `upstream` provider.
pub struct UpstreamProvider;

fn parse_object(json: &str) -> Result<serde_json::Value, ProviderError> {
    serde_json::from_str(json).map_err(|e| {
        ProviderError::Permanent(format!("the kube capability returned bad JSON: {e}"))
    })
}

/// The record named `name`, `None` when there is none of ours.
fn find(name: &str) -> Result<Option<Record>, ProviderError> {
    match capabilities::kube_get_if_present("v1", "ConfigMap", name)? {
        Some(object) => Ok(records::record_of(&parse_object(&object)?)),
        None => Ok(None),
    }
}

/// Every record.
fn all_records() -> Result<Vec<Record>, ProviderError> {
    kube::list("v1", "ConfigMap", Some(RECORD_SELECTOR))?
        .iter()
        .map(|o| parse_object(o).map(|o| records::record_of(&o)))
        .filter_map(Result::transpose)
        .collect()
}

fn not_found(name: &str) -> ProviderError {
    ProviderError::NotFound(format!(
        "no upstream is recorded for {name} in namespace {}",
        kube::namespace()
    ))
}

/// Writes `record` and reads it back.
fn write(record: &Record) -> Result<Record, ProviderError> {
    let applied = kube::apply(&record.object().to_string())?;
    records::record_of(&parse_object(&applied)?)
        .ok_or_else(|| ProviderError::Permanent("the written record does not read back".into()))
}

/// The instance of `record` after a look at every record. A listed upstream is `Provisioning`
/// until a look after the create (`verify`: a `get`; the operator looks again within seconds,
/// when every create of the same moment has written its record) finds no other Proxy took it;
/// of two, the later name moves to a free upstream.
fn observe(config: &Config, record: Record, verify: bool) -> Result<Instance, ProviderError> {
    let all = all_records()?;
    match records::look(&record, &all) {
        Look::Running => {
            let message = format!("upstream {}", record.url);
            records::instance_of(&record, InstanceState::Running, message)
        }
        Look::Verify if !verify => {
            let message = format!(
                "upstream {}; checking that no other Proxy took it at the same moment",
                record.url
            );
            records::instance_of(&record, InstanceState::Provisioning, message)
        }
        Look::Verify => {
            let record = write(&Record {
                verified: true,
                ..record
            })?;
            let message = format!("upstream {}", record.url);
            records::instance_of(&record, InstanceState::Running, message)
        }
        Look::Move { kept_by } => {
            let others: Vec<Record> = all.into_iter().filter(|r| r.name != record.name).collect();
            let taken = format!("{} was taken at the same moment by {kept_by}", record.url);
            match records::pick(config, &others, record.asked_zone.as_deref()) {
                Ok((upstream, zone)) => {
                    let moved = write(&Record {
                        url: upstream.url(),
                        zone: zone.map(str::to_string),
                        verified: false,
                        ..record
                    })?;
                    let message = format!("{taken}; moved to {}", moved.url);
                    capabilities::log(
                        Level::Info,
                        "upstream moved",
                        &[("instance", &moved.name), ("upstream", &moved.url)],
                    );
                    records::instance_of(&moved, InstanceState::Provisioning, message)
                }
                Err(e) => {
                    let message = format!("{taken}; waiting for a free upstream: {e:?}");
                    records::instance_of(&record, InstanceState::Provisioning, message)
                }
            }
        }
    }
}

impl Provider for UpstreamProvider {
    type Config = Config;

    fn info() -> PluginInfo {
        PluginInfo {
            name: PROVIDER_TYPE.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Proxies that exist already (a vendor's, your own): probed, leased and pooled like any other".into(),
            capabilities: vec![Capability::Log, Capability::Kube],
            config_schema: config::SCHEMA.to_string(),
        }
    }

    fn validate(config: &Config) -> Result<(), ProviderError> {
        config::validate(config)
    }

    fn create(config: Config, spec: InstanceSpec) -> Result<Instance, ProviderError> {
        let options = ProxyOptions::parse(&spec.options)?;
        // Idempotent by name: a record made before (a retry, a restart) is the instance.
        if let Some(record) = find(&spec.name)? {
            return observe(&config, record, false);
        }
        let record = match &options.url {
            Some(url) => {
                let upstream = Upstream::parse(url).map_err(|problem| {
                    ProviderError::Permanent(format!("spec.providerOptions.url: {problem}"))
                })?;
                let zone = spec.zone.as_deref();
                write(&Record::new(
                    &spec,
                    &upstream,
                    Source::ProviderOptions,
                    zone,
                ))?
            }
            None => {
                let (upstream, zone) =
                    records::pick(&config, &all_records()?, spec.zone.as_deref())?;
                write(&Record::new(&spec, &upstream, Source::Config, zone))?
            }
        };
        capabilities::log(
            Level::Info,
            "upstream assigned",
            &[("instance", &spec.name), ("upstream", &record.url)],
        );
        observe(&config, record, false)
    }

    fn get(config: Config, provider_id: String) -> Result<Instance, ProviderError> {
        let record = find(&provider_id)?.ok_or_else(|| not_found(&provider_id))?;
        observe(&config, record, true)
    }

    fn delete(_config: Config, provider_id: String) -> Result<(), ProviderError> {
        // Only the record goes: the upstream itself is not ours to delete.
        find(&provider_id)?.ok_or_else(|| not_found(&provider_id))?;
        capabilities::kube_delete_if_present("v1", "ConfigMap", &provider_id)
    }

    fn list(_config: Config) -> Result<Vec<Instance>, ProviderError> {
        all_records()?
            .iter()
            .filter(|r| r.owner.is_some())
            .map(|r| {
                let message = format!("upstream {}", r.url);
                records::instance_of(r, InstanceState::Running, message)
            })
            .collect()
    }

    fn check(config: Config) -> Result<Vec<CheckTarget>, ProviderError> {
        let namespace = kube::namespace();
        let (ok, reason, message) = match all_records() {
            Ok(records) => {
                let held = records
                    .iter()
                    .filter(|r| r.source == Source::Config)
                    .count();
                let listed = config.upstreams.len();
                let message = format!(
                    "{held} of {listed} listed upstreams held, {} named by their Proxies; each upstream is probed as its Proxy",
                    records.len() - held
                );
                (true, "Ok", message)
            }
            Err(ProviderError::Denied(m)) => (false, "Forbidden", m),
            Err(ProviderError::Unauthorized(m)) => (false, "Unauthorized", m),
            Err(e) => (false, "Unreachable", format!("{e:?}")),
        };
        Ok(vec![CheckTarget {
            target: format!("records in namespace {namespace}"),
            ok,
            reason: reason.into(),
            message,
            latency_ms: 0,
        }])
    }
}

export_provider!(UpstreamProvider);

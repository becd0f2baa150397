//! The `kubernetes` provider: a proxy is a squid Pod, with its squid.conf in a ConfigMap, a
//! Service in front of it and a NetworkPolicy admitting `config.allowFrom`, in the namespace the
//! host grants (`grants.kube`). The objects are named after the instance, so create is
//! idempotent; the Proxy's identity is in the Pod's annotations, which `get` and `list` read back
//! for the garbage collector. The Service's address is the proxy's (or the Pod's IP, with
//! `config.address: Pod`).
//!
//! Everything that decides something is a plain function in a module (tested natively); this file
//! only sequences the kube calls.

pub mod config;
pub mod objects;

use proxy_operator_sdk::capabilities::{self, Level, kube};
use proxy_operator_sdk::squid;
use proxy_operator_sdk::{
    Capability, CheckTarget, Instance, InstanceSpec, PluginInfo, Provider, ProviderError,
    ProxyCredentials, export_provider,
};
use serde_json::json;

use crate::config::{Config, ProxyOptions};

/// The provider type in the providers config.
pub const PROVIDER_TYPE: &str = "kubernetes";

/// The `kubernetes` provider.
pub struct KubernetesProvider;

fn parse_object(json: &str) -> Result<serde_json::Value, ProviderError> {
    serde_json::from_str(json).map_err(|e| {
        ProviderError::Permanent(format!("the kube capability returned bad JSON: {e}"))
    })
}

/// The object `kind` named `name`, `None` when there is none of ours.
fn find(kind: &str, name: &str) -> Result<Option<serde_json::Value>, ProviderError> {
    capabilities::kube_get_if_present("v1", kind, name)?
        .map(|object| parse_object(&object))
        .transpose()
}

/// The instance of a Pod, its address from the Pod and its Service as the config says.
fn instance_of(
    config: &Config,
    pod: &serde_json::Value,
    service: Option<&serde_json::Value>,
) -> Instance {
    Instance {
        address: objects::address(pod, service, config.address),
        ..objects::instance(pod)
    }
}

impl Provider for KubernetesProvider {
    type Config = Config;

    fn info() -> PluginInfo {
        PluginInfo {
            name: PROVIDER_TYPE.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "A squid Pod per Proxy in the cluster".into(),
            capabilities: vec![Capability::Log, Capability::Kube],
            config_schema: config::SCHEMA.to_string(),
        }
    }

    fn validate(config: &Config) -> Result<(), ProviderError> {
        config::validate(config)
    }

    fn create(config: Config, spec: InstanceSpec) -> Result<Instance, ProviderError> {
        // The host ran validate-config on the config before binding it.
        let options = ProxyOptions::parse(&spec.options)?;
        if let Some(credentials) = &spec.credentials {
            squid::validate_credentials(credentials)?;
        }
        // A Pod's spec cannot be changed in place: an existing one is the instance.
        let pod = match find("Pod", &spec.name)? {
            Some(pod) => pod,
            None => {
                if !spec.user_data.is_empty() {
                    capabilities::log(
                        Level::Info,
                        "cloud-init is not used by the kubernetes provider (squid runs from its image)",
                        &[("pod", &spec.name)],
                    );
                }
                kube::apply(&objects::configmap(&config, &spec).to_string())?;
                let pod = kube::apply(&objects::pod(&config, &spec).to_string())?;
                capabilities::log(
                    Level::Info,
                    "created squid pod",
                    &[("pod", &spec.name), ("namespace", &kube::namespace())],
                );
                parse_object(&pod)?
            }
        };
        // Applied on every create, so a Pod made before the provider had them gets them too.
        let service_type = options.service_type.unwrap_or(config.service_type);
        let service = kube::apply(&objects::service(&spec, service_type).to_string())?;
        kube::apply(&objects::network_policy(&config, &spec).to_string())?;
        Ok(instance_of(&config, &pod, Some(&parse_object(&service)?)))
    }

    fn get(config: Config, provider_id: String) -> Result<Instance, ProviderError> {
        match find("Pod", &provider_id)? {
            Some(pod) => Ok(instance_of(
                &config,
                &pod,
                find("Service", &provider_id)?.as_ref(),
            )),
            None => Err(ProviderError::NotFound(format!(
                "Pod {}/{provider_id} not found",
                kube::namespace()
            ))),
        }
    }

    /// Rewrites the password file in the proxy's ConfigMap; the kubelet brings it into the Pod
    /// (within its sync period, about a minute) and squid's helper re-reads it.
    fn set_credentials(
        _config: Config,
        provider_id: String,
        credentials: ProxyCredentials,
    ) -> Result<(), ProviderError> {
        squid::validate_credentials(&credentials)?;
        let name = objects::configmap_name(&provider_id);
        let Some(mut configmap) = find("ConfigMap", &name)? else {
            return Err(ProviderError::NotFound(format!(
                "ConfigMap {}/{name} of proxy {provider_id} not found",
                kube::namespace()
            )));
        };
        if configmap["data"].get(objects::PASSWORD_KEY).is_none() {
            return Err(ProviderError::Permanent(format!(
                "proxy {provider_id} was made without credentials, so its squid cannot take new ones; delete the Proxy to get one with credentials"
            )));
        }
        configmap["data"][objects::PASSWORD_KEY] = json!(squid::password_file(&credentials));
        kube::apply(&objects::reapplied(&configmap).to_string())?;
        capabilities::log(
            Level::Info,
            "rotated the proxy's credentials",
            &[("pod", &provider_id)],
        );
        Ok(())
    }

    fn delete(_config: Config, provider_id: String) -> Result<(), ProviderError> {
        capabilities::kube_delete_if_present("v1", "Pod", &provider_id)?;
        capabilities::kube_delete_if_present("v1", "Service", &provider_id)?;
        capabilities::kube_delete_if_present(
            "networking.k8s.io/v1",
            "NetworkPolicy",
            &provider_id,
        )?;
        capabilities::kube_delete_if_present(
            "v1",
            "ConfigMap",
            &objects::configmap_name(&provider_id),
        )
    }

    fn list(_config: Config) -> Result<Vec<Instance>, ProviderError> {
        let pods = kube::list("v1", "Pod", Some(objects::COMPONENT_SELECTOR))?;
        pods.iter()
            .map(|pod| parse_object(pod).map(|p| objects::instance(&p)))
            .filter(|i| i.as_ref().map_or(true, |i| i.owner.is_some()))
            .collect()
    }

    fn check(_config: Config) -> Result<Vec<CheckTarget>, ProviderError> {
        let namespace = kube::namespace();
        let (ok, reason, message) = match kube::list("v1", "Pod", Some(objects::COMPONENT_SELECTOR))
        {
            Ok(_) => (true, "Ok", String::new()),
            Err(kube::KubeError::Denied(m)) => (false, "Forbidden", m),
            Err(kube::KubeError::Unauthorized(m)) => (false, "Unauthorized", m),
            Err(e) => (false, "Unreachable", format!("{e:?}")),
        };
        Ok(vec![CheckTarget {
            target: format!("namespace {namespace}"),
            ok,
            reason: reason.into(),
            message,
            latency_ms: 0,
        }])
    }
}

export_provider!(KubernetesProvider);

//! Which namespaces may use a provider instance, and what their Proxies and ProxyPools may set
//! on it: the `access` section of a providers-config entry, and the pure decision the controllers
//! (and, as CEL, the admission policy of `access/policy.rs`) take from it. No I/O.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use crate::api::{ProxyPoolSpec, ProxySpec};

pub mod policy;

/// The `access` section of a provider instance, as written.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Access {
    /// Namespaces that may use the instance (besides its own kube grant namespace).
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// Namespaces whose labels match may use it too; `{}` matches every namespace.
    #[serde(default)]
    pub namespace_selector: Option<NamespaceSelector>,
    /// What their Proxies may set; each is refused unless allowed here.
    #[serde(default)]
    pub allow: Allow,
}

/// A label selector over Namespaces (`matchLabels` only: every label must be equal).
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NamespaceSelector {
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

/// What a Proxy on the instance may set. The defaults are the safe ones: nothing runs as root on
/// the platform's machines but the operator's own cloud-init, squid keeps its rules, and the
/// Service stays inside the cluster.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Allow {
    /// `spec.cloudInit` (user cloud-init, runs as root on the VM).
    #[serde(default)]
    pub user_data: bool,
    /// `spec.vendorData`.
    #[serde(default)]
    pub vendor_data: bool,
    /// `spec.providerOptions.managedSquid: false` (squid without the operator's rules).
    #[serde(default)]
    pub unmanaged_squid: bool,
    /// The values `spec.providerOptions.serviceType` may take (absent: the provider's default).
    #[serde(default = "cluster_ip_only")]
    pub service_types: Vec<String>,
    /// The largest `spec.replicas` of a ProxyPool on the instance.
    #[serde(default)]
    pub max_pool_replicas: Option<i32>,
}

impl Default for Allow {
    fn default() -> Self {
        Allow {
            user_data: false,
            vendor_data: false,
            unmanaged_squid: false,
            service_types: cluster_ip_only(),
            max_pool_replicas: None,
        }
    }
}

fn cluster_ip_only() -> Vec<String> {
    vec!["ClusterIP".into()]
}

const SERVICE_TYPES: [&str; 3] = ["ClusterIP", "NodePort", "LoadBalancer"];

impl Access {
    /// Checks the section; the error names the field under `access.` and the fix.
    pub fn validate(&self, home: Option<&str>) -> Result<(), String> {
        for (index, namespace) in self.namespaces.iter().enumerate() {
            if !crate::support::names::is_dns_label(namespace) {
                return Err(format!(
                    "access.namespaces[{index}]: `{namespace}` is not a namespace name; use lowercase letters, digits and `-`"
                ));
            }
        }
        for (index, kind) in self.allow.service_types.iter().enumerate() {
            if !SERVICE_TYPES.contains(&kind.as_str()) {
                return Err(format!(
                    "access.allow.serviceTypes[{index}]: `{kind}` is not a Service type; use ClusterIP, NodePort or LoadBalancer"
                ));
            }
        }
        if let Some(max) = self.allow.max_pool_replicas
            && !(0..=crate::api::MAX_POOL_REPLICAS).contains(&max)
        {
            return Err(format!(
                "access.allow.maxPoolReplicas: {max} is outside 0..={}",
                crate::api::MAX_POOL_REPLICAS
            ));
        }
        if self.namespaces.is_empty() && self.namespace_selector.is_none() && home.is_none() {
            return Err("access: no namespace may use this instance; list them in access.namespaces, or select them with access.namespaceSelector ({} selects every namespace)".into());
        }
        Ok(())
    }
}

/// An instance's access, resolved: the namespaces named (its kube grant namespace included), the
/// selector and what Proxies may set.
#[derive(Debug, Clone, PartialEq)]
pub struct Rules {
    /// The provider instance.
    pub provider: String,
    pub namespaces: BTreeSet<String>,
    pub selector: Option<BTreeMap<String, String>>,
    pub allow: Allow,
}

impl Access {
    /// The rules of provider instance `provider` whose kube grant (if any) is in `home`.
    pub fn rules(&self, provider: &str, home: Option<&str>) -> Rules {
        let mut namespaces: BTreeSet<String> = self.namespaces.iter().cloned().collect();
        namespaces.extend(home.map(str::to_string));
        Rules {
            provider: provider.to_string(),
            namespaces,
            selector: self
                .namespace_selector
                .as_ref()
                .map(|s| s.match_labels.clone()),
            allow: self.allow.clone(),
        }
    }
}

impl Rules {
    /// Whether the selector must see the namespace's labels to decide.
    pub fn needs_labels(&self) -> bool {
        self.selector.is_some()
    }
}

/// Why a Proxy or ProxyPool may not use a provider instance: the field, the rule, the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub field: String,
    pub rule: String,
    pub fix: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}; {}", self.field, self.rule, self.fix)
    }
}

/// Decides whether a Proxy spec (at `prefix`, e.g. `spec.` or `spec.template.spec.`) in
/// `namespace` (with `labels`) may use the instance of `rules`; `provider_field` names where the
/// spec names the instance. `None` rules: no `access` section, everything is allowed.
pub fn check(
    rules: Option<&Rules>,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    provider_field: &str,
    prefix: &str,
    spec: &ProxySpec,
) -> Result<(), Refusal> {
    let Some(rules) = rules else {
        return Ok(());
    };
    let provider = &rules.provider;
    let refuse = |field: String, rule: String, fix: &str| Refusal {
        field,
        rule,
        fix: fix.to_string(),
    };
    if !namespace_allowed(rules, namespace, labels) {
        return Err(refuse(
            provider_field.to_string(),
            format!(
                "namespace `{namespace}` may not use provider instance `{provider}` (its access allows {})",
                allowed_namespaces(rules)
            ),
            "use a provider instance your namespace may use, or ask the platform team to add the namespace to its access in the providers config",
        ));
    }
    let allow = &rules.allow;
    if spec.cloud_init.is_some() && !allow.user_data {
        return Err(refuse(
            format!("{prefix}cloudInit"),
            format!(
                "provider instance `{provider}` does not allow user cloud-init (access.allow.userData is false)"
            ),
            "remove it, or ask the platform team to set access.allow.userData",
        ));
    }
    if spec.vendor_data.is_some() && !allow.vendor_data {
        return Err(refuse(
            format!("{prefix}vendorData"),
            format!(
                "provider instance `{provider}` does not allow vendor data (access.allow.vendorData is false)"
            ),
            "remove it, or ask the platform team to set access.allow.vendorData",
        ));
    }
    let option = |key: &str| spec.provider_options.as_ref().and_then(|o| o.get(key));
    if option("managedSquid").is_some_and(|v| *v != serde_json::Value::Bool(true))
        && !allow.unmanaged_squid
    {
        return Err(refuse(
            format!("{prefix}providerOptions.managedSquid"),
            format!(
                "provider instance `{provider}` keeps squid managed (access.allow.unmanagedSquid is false)"
            ),
            "remove it, or ask the platform team to set access.allow.unmanagedSquid",
        ));
    }
    if let Some(kind) = option("serviceType")
        && !kind
            .as_str()
            .is_some_and(|k| allow.service_types.iter().any(|t| t == k))
    {
        return Err(refuse(
            format!("{prefix}providerOptions.serviceType"),
            format!(
                "provider instance `{provider}` allows the Service types [{}] only (access.allow.serviceTypes), not {kind}",
                allow.service_types.join(", ")
            ),
            "use one of them, or ask the platform team to add it to access.allow.serviceTypes",
        ));
    }
    Ok(())
}

/// The pool's check: each provider instance it names (template and spread), with its rules from
/// `rules_of`, and its replicas against `maxPoolReplicas`.
pub fn check_pool<'a>(
    rules_of: impl Fn(&str) -> Option<&'a Rules>,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    spec: &ProxyPoolSpec,
) -> Result<(), Refusal> {
    for (field, provider) in pool_providers(spec) {
        let rules = rules_of(&provider);
        check(
            rules,
            namespace,
            labels,
            &field,
            "spec.template.spec.",
            &spec.template.spec,
        )?;
        if let Some(rules) = rules
            && let Some(max) = rules.allow.max_pool_replicas
            && spec.replicas > max
        {
            return Err(Refusal {
                field: "spec.replicas".into(),
                rule: format!(
                    "provider instance `{provider}` allows pools of at most {max} (access.allow.maxPoolReplicas), not {}",
                    spec.replicas
                ),
                fix: "lower it, or ask the platform team to raise access.allow.maxPoolReplicas"
                    .into(),
            });
        }
    }
    Ok(())
}

/// Every provider instance a pool names, with the field naming it: the template's and each
/// spread entry's (the admission policy checks the same set).
pub fn pool_providers(spec: &ProxyPoolSpec) -> Vec<(String, String)> {
    let mut out = vec![(
        "spec.template.spec.provider".to_string(),
        spec.template.spec.provider.clone(),
    )];
    for (index, target) in spec.spread.iter().enumerate() {
        if let Some(provider) = &target.provider
            && !out.iter().any(|(_, p)| p == provider)
        {
            out.push((format!("spec.spread[{index}].provider"), provider.clone()));
        }
    }
    out
}

fn namespace_allowed(rules: &Rules, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
    rules.namespaces.contains(namespace)
        || rules
            .selector
            .as_ref()
            .is_some_and(|want| want.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

fn allowed_namespaces(rules: &Rules) -> String {
    let mut parts = Vec::new();
    if !rules.namespaces.is_empty() {
        let names: Vec<&str> = rules.namespaces.iter().map(String::as_str).collect();
        parts.push(format!("namespaces [{}]", names.join(", ")));
    }
    if let Some(selector) = &rules.selector {
        let labels: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
        parts.push(format!("namespaces labelled [{}]", labels.join(", ")));
    }
    parts.join(" and ")
}

#[cfg(test)]
mod tests;

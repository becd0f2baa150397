//! `grants.kube`: the kinds a provider instance may use, in one namespace.

use serde::Deserialize;

use super::GrantError;
use crate::support::names::is_dns_label;

/// The `grants.kube` section of a provider instance.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubeGrant {
    /// The namespace the plugin's objects live in.
    pub namespace: String,
    /// `apiVersion/Kind` of each kind it may use, e.g. `v1/Pod`, `v1/ConfigMap`, `apps/v1/Deployment`.
    pub kinds: Vec<String>,
    /// Where the plugin's Pods may be scheduled (`nodeSelector` keys, tolerations).
    #[serde(default)]
    pub scheduling: Option<SchedulingGrant>,
    /// How many objects of each kind, and how many bytes of them, the instance may keep.
    #[serde(default)]
    pub quota: Option<QuotaGrant>,
}

/// `grants.kube.quota`: per kind, the most objects (and their total size) one provider instance
/// may keep; a create past either is refused. Defaults [`DEFAULT_QUOTA_OBJECTS`] and
/// [`DEFAULT_QUOTA_MEBIBYTES`].
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct QuotaGrant {
    #[serde(default)]
    pub objects: Option<u32>,
    #[serde(default)]
    pub mebibytes: Option<u32>,
}

/// Objects of one kind a provider instance may keep by default: the kubernetes provider makes one
/// of each kind per Proxy, so 1000 Proxies.
pub const DEFAULT_QUOTA_OBJECTS: u32 = 1000;
/// Their total size by default (etcd keeps every object, 2 GiB in all by default).
pub const DEFAULT_QUOTA_MEBIBYTES: u32 = 64;

/// `grants.kube.scheduling`: the scheduling fields a plugin's Pods may set. A toleration lets a
/// Pod onto tainted nodes (the control plane's), so none is allowed unless granted here.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SchedulingGrant {
    /// Node label keys a Pod's `nodeSelector` may use (any value); default
    /// [`DEFAULT_NODE_SELECTOR_KEYS`].
    #[serde(default)]
    pub node_selector_keys: Option<Vec<String>>,
    /// Tolerations a Pod may carry, each as in a Pod spec (`key`, `operator`, `value`, `effect`).
    #[serde(default)]
    pub tolerations: Vec<Toleration>,
}

/// One toleration a plugin's Pods may carry.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Toleration {
    #[serde(default)]
    pub key: String,
    #[serde(default)]
    pub operator: Option<String>,
    #[serde(default)]
    pub value: String,
    #[serde(default)]
    pub effect: String,
}

/// The node label keys a plugin's Pods may select by when the grant names none: the zone (a
/// Proxy's placement). Selecting a node cannot pass its taints; tolerating them is what is bounded.
pub const DEFAULT_NODE_SELECTOR_KEYS: &[&str] = &["topology.kubernetes.io/zone"];

/// A Kubernetes kind, e.g. `apps/v1` `Deployment`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KubeKind {
    pub api_version: String,
    pub kind: String,
}

/// A checked `grants.kube`.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidKubeGrant {
    pub namespace: String,
    pub kinds: Vec<KubeKind>,
    /// `nodeSelector` keys a Pod may use.
    pub node_selector_keys: Vec<String>,
    /// Tolerations a Pod may carry (`operator` filled in: `Equal` when not given).
    pub tolerations: Vec<Toleration>,
    /// Per kind: the most objects, and the most bytes of them.
    pub quota_objects: usize,
    pub quota_bytes: usize,
}

impl ValidKubeGrant {
    /// Checks the namespace and each kind; Secrets are never granted.
    pub fn parse(grant: &KubeGrant) -> Result<Self, GrantError> {
        let err = |message: String| GrantError::Kube(message);
        if !is_dns_label(&grant.namespace) {
            return Err(err(format!(
                "namespace: `{}` is not a namespace name (lowercase letters, digits and '-', at most 63)",
                grant.namespace
            )));
        }
        if grant.kinds.is_empty() {
            return Err(err(
                "kinds: empty; list the kinds the plugin may use, e.g. [v1/Pod, v1/ConfigMap]"
                    .into(),
            ));
        }
        let kinds = grant
            .kinds
            .iter()
            .enumerate()
            .map(|(index, entry)| {
                KubeKind::parse(entry).map_err(|m| err(format!("kinds[{index}]: {m}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let scheduling = grant.scheduling.clone().unwrap_or_default();
        let node_selector_keys = scheduling.node_selector_keys.unwrap_or_else(|| {
            DEFAULT_NODE_SELECTOR_KEYS
                .iter()
                .map(|k| k.to_string())
                .collect()
        });
        let mut tolerations = Vec::new();
        for (index, toleration) in scheduling.tolerations.into_iter().enumerate() {
            let operator = toleration
                .operator
                .clone()
                .unwrap_or_else(|| "Equal".into());
            if operator != "Equal" && operator != "Exists" {
                return Err(err(format!(
                    "scheduling.tolerations[{index}].operator: `{operator}`; use Equal or Exists"
                )));
            }
            if toleration.key.is_empty() && operator == "Exists" {
                return Err(err(format!(
                    "scheduling.tolerations[{index}]: an empty key with Exists tolerates every taint; name the taint's key"
                )));
            }
            tolerations.push(Toleration {
                operator: Some(operator),
                ..toleration
            });
        }
        let quota = grant.quota.unwrap_or_default();
        if quota.objects == Some(0) || quota.mebibytes == Some(0) {
            return Err(err(
                "quota: 0 allows nothing; give at least 1 (or leave it out for the default)".into(),
            ));
        }
        Ok(ValidKubeGrant {
            namespace: grant.namespace.clone(),
            kinds,
            node_selector_keys,
            tolerations,
            quota_objects: quota.objects.unwrap_or(DEFAULT_QUOTA_OBJECTS) as usize,
            quota_bytes: (quota.mebibytes.unwrap_or(DEFAULT_QUOTA_MEBIBYTES) as usize) << 20,
        })
    }
}

impl KubeKind {
    /// `apps/v1/Deployment` → (`apps/v1`, `Deployment`).
    fn parse(entry: &str) -> Result<Self, String> {
        let not_a_kind =
            || format!("`{entry}` is not apiVersion/Kind, e.g. v1/Pod or apps/v1/Deployment");
        let (api_version, kind) = entry.rsplit_once('/').ok_or_else(not_a_kind)?;
        let valid_version = !api_version.is_empty()
            && api_version.split('/').count() <= 2
            && !api_version.contains(char::is_whitespace);
        if !valid_version || kind.is_empty() || !kind.starts_with(|c: char| c.is_ascii_uppercase())
        {
            return Err(not_a_kind());
        }
        if api_version == "v1" && kind == "Secret" {
            return Err("Secrets cannot be granted: a plugin never sees a secret; let the host add credentials (grants.http.credentials)".into());
        }
        // Hand-written endpoints attach any address to any Service of the namespace, including
        // Services that are not the plugin's: Services select their Pods (the host checks it).
        if matches!(
            (api_version, kind),
            ("v1", "Endpoints") | ("discovery.k8s.io/v1", "EndpointSlice")
        ) {
            return Err(format!(
                "{kind} cannot be granted: endpoints written by hand would attach addresses to other Services of the namespace; a plugin's Services select its Pods"
            ));
        }
        Ok(KubeKind {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
        })
    }
}

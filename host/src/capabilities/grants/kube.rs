//! `grants.kube`: the kinds a provider instance may use, in one namespace.

use serde::Deserialize;

use super::GrantError;
use crate::names::is_dns_label;

/// The `grants.kube` section of a provider instance.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubeGrant {
    /// The namespace the plugin's objects live in.
    pub namespace: String,
    /// `apiVersion/Kind` of each kind it may use, e.g. `v1/Pod`, `v1/ConfigMap`, `apps/v1/Deployment`.
    pub kinds: Vec<String>,
}

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
        Ok(ValidKubeGrant {
            namespace: grant.namespace.clone(),
            kinds,
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

//! The `kube` capability: Kubernetes objects of the granted kinds, in the one granted namespace,
//! through the operator's own client. Every object a plugin applies is labelled with its provider
//! instance, and a plugin sees, changes and deletes only objects with that label: a namespace
//! shared with people or other provider instances stays theirs. Secrets cannot be granted (a
//! plugin never sees a secret); every Pod a plugin makes passes the allow-list of
//! [`pod_policy`] (no host access, no API token, no Secret, only its own ConfigMaps, only the
//! granted images); only kinds the host knows can be granted, and each is confined by its
//! policy ([`object_policy`]: its templates carry the instance's label, its selectors select
//! only the instance's Pods; Services and NetworkPolicies reach only its own Pods,
//! [`traffic_policy`]); and the operator's own objects ([`OperatorObjects`]) are out of reach
//! whatever the grant.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, Preconditions,
};
use kube::core::{ApiResource, GroupVersionKind};
use kube::discovery::Scope;

use crate::api::labels::PROVIDER_LABEL;
/// The standard label naming the tool that manages an object.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "proxy-operator";
/// Largest object a plugin may apply (etcd's default request limit is 1.5 MiB).
pub const MAX_OBJECT_BYTES: usize = 1024 * 1024;

pub mod metadata_policy;
pub mod object_policy;
mod operator_objects;

/// Objects per page of a `list` (each at most [`MAX_OBJECT_BYTES`]).
const LIST_PAGE: u32 = 20;
/// What one `list` answers at most when no memory limit is given (half the default 128 MiB).
const DEFAULT_LIST_BUDGET: usize = 64 << 20;
pub mod pod_policy;
pub mod traffic_policy;

pub use super::grants::KubeGrant;
use super::grants::ValidKubeGrant;
pub use operator_objects::{OperatorObject, OperatorObjects};

/// Why a kube call failed, as the WIT `kube-error` variant says it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KubeError {
    #[error("denied: {0}")]
    Denied(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("invalid: {0}")]
    Invalid(String),
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    #[error("transport: {0}")]
    Transport(String),
}

type Result<T> = std::result::Result<T, KubeError>;

/// The parsed grant of one provider instance, and the client its calls use.
#[derive(Clone)]
pub struct KubeCapability {
    /// The provider instance: the value of [`PROVIDER_LABEL`] on its objects.
    provider: String,
    namespace: Option<String>,
    /// `(apiVersion, kind)` granted.
    kinds: Vec<(String, String)>,
    client: Option<kube::Client>,
    /// Kinds resolved through API discovery, shared by the calls of this provider instance.
    resolved: Arc<Mutex<HashMap<(String, String), ApiResource>>>,
    /// Whether the plugin declared `kube`; if not, its calls are refused.
    declared: bool,
    /// Objects no plugin may touch, whatever its grant.
    operator_objects: Arc<OperatorObjects>,
    /// Where the grant lets the plugin's Pods be scheduled, and what they may run.
    pods: pod_policy::PodGrant,
    /// The most bytes of objects one `list` answers.
    list_budget: usize,
    /// Per kind: the most objects and bytes of them this instance may keep.
    quota: (usize, usize),
    /// Creates wait for each other, so that two at once cannot both pass the quota.
    creating: Arc<tokio::sync::Mutex<()>>,
}

impl std::fmt::Debug for KubeCapability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeCapability")
            .field("namespace", &self.namespace)
            .field("kinds", &self.kinds)
            .field("client", &self.client.is_some())
            .finish()
    }
}

impl KubeCapability {
    /// Binds a valid grant to the client its calls use (the operator's; `None`: no cluster).
    /// `None` grants nothing.
    pub fn bind(
        provider: &str,
        grant: Option<&ValidKubeGrant>,
        client: Option<kube::Client>,
        operator_objects: Arc<OperatorObjects>,
        declared: bool,
    ) -> Self {
        KubeCapability {
            provider: provider.to_string(),
            namespace: grant.map(|g| g.namespace.clone()),
            kinds: grant
                .map(|g| {
                    g.kinds
                        .iter()
                        .map(|k| (k.api_version.clone(), k.kind.clone()))
                        .collect()
                })
                .unwrap_or_default(),
            client,
            resolved: Arc::default(),
            declared,
            operator_objects,
            pods: grant
                .map(|g| pod_policy::PodGrant {
                    scheduling: pod_policy::Scheduling {
                        node_selector_keys: g.node_selector_keys.clone(),
                        tolerations: g.tolerations.clone(),
                    },
                    images: g.images.clone(),
                })
                .unwrap_or_default(),
            list_budget: DEFAULT_LIST_BUDGET,
            quota: grant
                .map(|g| (g.quota_objects, g.quota_bytes))
                .unwrap_or_default(),
            creating: Arc::default(),
        }
    }

    /// The granted namespace, or "" when none is granted.
    pub fn namespace(&self) -> String {
        self.namespace.clone().unwrap_or_default()
    }

    pub async fn get(&self, api_version: &str, kind: &str, name: &str) -> Result<String> {
        self.granted(api_version, kind)?;
        check_name(kind, name)?;
        let api = self.api(api_version, kind).await?;
        let object = api
            .get_opt(name)
            .await
            .map_err(|e| api_error(e, kind, name))?;
        match object {
            Some(object) if self.owns(&object) => to_json(&object),
            // Somebody else's object is not there for this plugin.
            _ => Err(self.not_found(kind, name)),
        }
    }

    /// The object a plugin sent, parsed and placed: its types, its name (checked by its kind's
    /// rules) and its namespace (the granted one, filled in when missing).
    fn parse_for_apply(
        &self,
        object: &str,
    ) -> Result<(DynamicObject, kube::core::TypeMeta, String, String)> {
        if object.len() > MAX_OBJECT_BYTES {
            return Err(KubeError::Invalid(format!(
                "the object is {} bytes; at most {MAX_OBJECT_BYTES} are accepted",
                object.len()
            )));
        }
        let mut object: DynamicObject = serde_json::from_str(object).map_err(|e| {
            KubeError::Invalid(format!("the object is not a Kubernetes object: {e}"))
        })?;
        let Some(types) = object.types.clone() else {
            return Err(KubeError::Invalid(
                "the object has no apiVersion and kind".into(),
            ));
        };
        let Some(name) = object.metadata.name.clone() else {
            return Err(KubeError::Invalid(
                "the object has no metadata.name (generateName is not supported)".into(),
            ));
        };
        let namespace = self.granted(&types.api_version, &types.kind)?.to_string();
        check_name(&types.kind, &name)?;
        match object.metadata.namespace.as_deref() {
            None => object.metadata.namespace = Some(namespace.clone()),
            Some(ns) if ns == namespace => {}
            Some(other) => {
                return Err(KubeError::Denied(format!(
                    "{} {name}: namespace {other} is not granted; this provider instance may use namespace {namespace} only",
                    types.kind
                )));
            }
        }
        Ok((object, types, name, namespace))
    }

    /// Server-side apply; the object's namespace is the granted one, and the provider label is
    /// added. An existing object without that label is refused, never taken over.
    pub async fn apply(&self, object: &str) -> Result<String> {
        let (mut object, types, name, namespace) = self.parse_for_apply(object)?;
        self.refuse_operator_object(&types.api_version, &types.kind, &namespace, &name)?;
        let refused = |problem: String| {
            KubeError::Denied(format!(
                "{} {name}: {problem}; see docs/security.md (kube)",
                types.kind
            ))
        };
        let Some(policy) = object_policy::KindPolicy::of(&types.api_version, &types.kind) else {
            // Not reached: a grant names only kinds the host knows (`grants::KNOWN_KINDS`).
            return Err(refused(format!(
                "{}/{} has no policy of the host",
                types.api_version, types.kind
            )));
        };
        metadata_policy::check(
            object.metadata.labels.as_ref(),
            object.metadata.annotations.as_ref(),
            &object.data,
            &[
                (PROVIDER_LABEL, self.provider.as_str()),
                (MANAGED_BY_LABEL, MANAGED_BY),
            ],
        )
        .map_err(refused)?;
        let references = pod_policy::check(&object.data, &self.pods).map_err(|problem| {
            KubeError::Denied(format!(
                "{} {name}: {problem}; see docs/security.md (kube) for what a plugin's Pods may be",
                types.kind
            ))
        })?;
        let api = self.api(&types.api_version, &types.kind).await?;
        let existing = api
            .get_opt(&name)
            .await
            .map_err(|e| api_error(e, &types.kind, &name))?;
        if let Some(existing) = &existing
            && !self.owns(existing)
        {
            return Err(KubeError::Denied(format!(
                "{} {namespace}/{name} exists and is not managed by provider instance {}; pick another name",
                types.kind, self.provider
            )));
        }
        for configmap in &references.configmaps {
            self.refuse_foreign_configmap(&types.kind, &name, &namespace, configmap)
                .await?;
        }
        let own = (PROVIDER_LABEL, self.provider.as_str());
        object_policy::confine(policy, &mut object.data, own).map_err(refused)?;
        let labels = object.metadata.labels.get_or_insert_with(Default::default);
        labels.insert(PROVIDER_LABEL.into(), self.provider.clone());
        labels.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
        let manager = format!("proxy-operator.{}", self.provider);
        let applied = match existing {
            // The ownership check and the write are two requests: the write holds only over the
            // object that was checked (its uid and version), never one put in its place.
            Some(existing) => {
                object.metadata.uid = existing.metadata.uid.clone();
                object.metadata.resource_version = existing.metadata.resource_version.clone();
                let params = PatchParams::apply(&manager).force();
                api.patch(&name, &params, &Patch::Apply(&object)).await
            }
            // Nothing there: a create, which fails if somebody made the object meanwhile, and
            // only within the quota.
            None => {
                let _one_at_a_time = self.creating.lock().await;
                let size = serde_json::to_vec(&object).map(|b| b.len()).unwrap_or(0);
                self.within_quota(&api, &types.kind, size).await?;
                let params = PostParams {
                    field_manager: Some(manager),
                    ..PostParams::default()
                };
                api.create(&params, &object).await
            }
        }
        .map_err(|e| api_error(e, &types.kind, &name))?;
        to_json(&applied)
    }

    pub async fn delete(&self, api_version: &str, kind: &str, name: &str) -> Result<()> {
        self.granted(api_version, kind)?;
        check_name(kind, name)?;
        let api = self.api(api_version, kind).await?;
        self.refuse_operator_object(api_version, kind, &self.namespace(), name)?;
        let object = match api
            .get_opt(name)
            .await
            .map_err(|e| api_error(e, kind, name))?
        {
            Some(object) if self.owns(&object) => object,
            _ => return Err(self.not_found(kind, name)),
        };
        // Only the object that was checked is deleted, not one put in its place since.
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: object.metadata.uid.clone(),
                resource_version: object.metadata.resource_version.clone(),
            }),
            ..DeleteParams::background()
        };
        api.delete(name, &params)
            .await
            .map(drop)
            .map_err(|e| api_error(e, kind, name))
    }

    /// The provider instance's objects of a kind, optionally narrowed by a label selector.
    pub async fn list(
        &self,
        api_version: &str,
        kind: &str,
        selector: Option<&str>,
    ) -> Result<Vec<String>> {
        let api = self.api(api_version, kind).await?;
        let own = format!("{PROVIDER_LABEL}={}", self.provider);
        let selector = match selector.map(str::trim).filter(|s| !s.is_empty()) {
            Some(extra) => format!("{own},{extra}"),
            None => own,
        };
        // Paged, and bounded by what the plugin can take: the host never holds more of a list
        // than the answer may be (#36: one list of 190 MiB took the operator to 729 MiB).
        let mut params = ListParams::default().labels(&selector).limit(LIST_PAGE);
        let mut items = Vec::new();
        let mut bytes = 0usize;
        loop {
            let page = api
                .list(&params)
                .await
                .map_err(|e| api_error(e, kind, ""))?;
            for item in &page.items {
                let json = to_json(item)?;
                bytes += json.len();
                if bytes > self.list_budget {
                    return Err(KubeError::Denied(format!(
                        "the list of {kind} passes {} MiB after {} objects, more than this plugin's answers may hold ({} MiB, half its memory limit); narrow the label selector or delete objects",
                        bytes >> 20,
                        items.len(),
                        self.list_budget >> 20
                    )));
                }
                items.push(json);
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(items),
            }
        }
    }

    /// Refuses a new object of `kind` (of `size` bytes) past the instance's quota for the kind.
    async fn within_quota(&self, api: &Api<DynamicObject>, kind: &str, size: usize) -> Result<()> {
        let (max_objects, max_bytes) = self.quota;
        let own = format!("{PROVIDER_LABEL}={}", self.provider);
        let mut params = ListParams::default().labels(&own).limit(LIST_PAGE * 5);
        let (mut objects, mut bytes) = (0usize, 0usize);
        loop {
            let page = api
                .list(&params)
                .await
                .map_err(|e| api_error(e, kind, ""))?;
            objects += page.items.len();
            bytes += page
                .items
                .iter()
                .map(|o| serde_json::to_vec(o).map(|b| b.len()).unwrap_or(0))
                .sum::<usize>();
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
        if objects + 1 > max_objects {
            return Err(KubeError::Denied(format!(
                "quota: provider instance {} has {objects} {kind} objects, the most grants.kube.quota.objects allows ({max_objects}); delete some, or raise the quota",
                self.provider
            )));
        }
        if bytes + size > max_bytes {
            return Err(KubeError::Denied(format!(
                "quota: provider instance {}'s {kind} objects would take {} KiB, more than grants.kube.quota.mebibytes allows ({} MiB); delete some, or raise the quota",
                self.provider,
                (bytes + size) >> 10,
                max_bytes >> 20
            )));
        }
        Ok(())
    }

    /// Bounds what a `list` may answer by the plugin's memory limit (the answer is copied into
    /// it): half of it, so the plugin has room to read the answer.
    pub fn with_memory_limit(mut self, memory_limit: usize) -> Self {
        self.list_budget = memory_limit / 2;
        self
    }

    fn refuse_operator_object(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Result<()> {
        if self
            .operator_objects
            .contains(api_version, kind, namespace, name)
        {
            return Err(KubeError::Denied(format!(
                "{kind} {namespace}/{name} is one of the operator's own objects; no plugin may create, change or delete it"
            )));
        }
        Ok(())
    }

    /// A Pod may mount or read only ConfigMaps this provider instance applied: they must exist,
    /// with its label, before the Pod that references them.
    async fn refuse_foreign_configmap(
        &self,
        kind: &str,
        name: &str,
        namespace: &str,
        configmap: &str,
    ) -> Result<()> {
        let client = self.client()?;
        let maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(client.clone(), namespace);
        let owned = maps
            .get_opt(configmap)
            .await
            .map_err(|e| api_error(e, "ConfigMap", configmap))?
            .and_then(|map| map.metadata.labels)
            .and_then(|labels| labels.get(PROVIDER_LABEL).cloned())
            .is_some_and(|owner| owner == self.provider);
        if owned {
            return Ok(());
        }
        Err(KubeError::Denied(format!(
            "{kind} {name} references ConfigMap {configmap}, which provider instance {} did not apply; apply the ConfigMap through the kube capability first",
            self.provider
        )))
    }

    /// The operator's client, or why there is none.
    fn client(&self) -> Result<&kube::Client> {
        self.client.as_ref().ok_or_else(|| {
            KubeError::Denied(
                "no Kubernetes cluster: this operator runs without one (e.g. `plugin run`)".into(),
            )
        })
    }

    fn owns(&self, object: &DynamicObject) -> bool {
        object
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(PROVIDER_LABEL))
            .is_some_and(|v| *v == self.provider)
    }

    fn not_found(&self, kind: &str, name: &str) -> KubeError {
        KubeError::NotFound(format!("{kind} {}/{name} not found", self.namespace()))
    }

    /// The granted namespace, if `apiVersion/kind` is granted.
    fn granted(&self, api_version: &str, kind: &str) -> Result<&str> {
        if !self.declared {
            return Err(KubeError::Denied(super::declared::undeclared("kube")));
        }
        let Some(namespace) = &self.namespace else {
            return Err(KubeError::Denied(
                "no Kubernetes objects are granted; add grants.kube {namespace, kinds} to this provider instance".into(),
            ));
        };
        if !self
            .kinds
            .iter()
            .any(|(v, k)| v == api_version && k == kind)
        {
            return Err(KubeError::Denied(format!(
                "{api_version}/{kind} is not in grants.kube.kinds ({})",
                self.kinds
                    .iter()
                    .map(|(v, k)| format!("{v}/{k}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        Ok(namespace)
    }

    /// The namespaced API of a granted kind.
    async fn api(&self, api_version: &str, kind: &str) -> Result<Api<DynamicObject>> {
        let namespace = self.granted(api_version, kind)?;
        let key = (api_version.to_string(), kind.to_string());
        let client = self.client()?;
        let cached = self
            .resolved
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .cloned();
        let resource = match cached {
            Some(resource) => resource,
            None => {
                let (group, version) = match api_version.split_once('/') {
                    Some((group, version)) => (group, version),
                    None => ("", api_version),
                };
                let gvk = GroupVersionKind::gvk(group, version, kind);
                let (resource, capabilities) = kube::discovery::pinned_kind(client, &gvk)
                    .await
                    .map_err(|e| match e {
                        kube::Error::Api(ae) if ae.code == 404 => KubeError::Invalid(format!(
                            "the cluster has no kind {api_version}/{kind}"
                        )),
                        kube::Error::Discovery(_) => KubeError::Invalid(format!(
                            "the cluster has no kind {api_version}/{kind}"
                        )),
                        other => api_error(other, kind, ""),
                    })?;
                if capabilities.scope != Scope::Namespaced {
                    return Err(KubeError::Denied(format!(
                        "{api_version}/{kind} is cluster-scoped; a plugin may use namespaced objects only"
                    )));
                }
                self.resolved
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key, resource.clone());
                resource
            }
        };
        Ok(Api::namespaced_with(client.clone(), namespace, &resource))
    }
}

/// An object's name must be one the API server accepts for its kind, checked before it goes into a
/// request's path (`..`, `/`, `?` would address something else).
fn check_name(kind: &str, name: &str) -> Result<()> {
    // Services (and Namespaces) are DNS-1035/1123 labels; most kinds are DNS-1123 subdomains.
    let label_kinds = ["Service", "Namespace"];
    if label_kinds.contains(&kind) {
        if crate::support::names::is_dns_label(name)
            && name.starts_with(|c: char| c.is_ascii_lowercase())
        {
            return Ok(());
        }
        return Err(KubeError::Invalid(format!(
            "{kind} name `{}`: not a DNS-1035 label (lowercase letters, digits and '-', starting with a letter, at most 63)",
            name.escape_debug()
        )));
    }
    if crate::support::names::is_dns_subdomain(name) {
        return Ok(());
    }
    Err(KubeError::Invalid(format!(
        "{kind} name `{}`: not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', at most 253)",
        name.escape_debug()
    )))
}

fn to_json(object: &DynamicObject) -> Result<String> {
    serde_json::to_string(object).map_err(|e| KubeError::Transport(format!("encode: {e}")))
}

/// The WIT error for a client error: the API server's status code decides.
fn api_error(error: kube::Error, kind: &str, name: &str) -> KubeError {
    let what = if name.is_empty() {
        kind.to_string()
    } else {
        format!("{kind} {name}")
    };
    match error {
        kube::Error::Api(ae) => {
            let message = format!("{what}: {}", ae.message);
            match ae.code {
                404 => KubeError::NotFound(message),
                409 => KubeError::Conflict(message),
                400 | 422 => KubeError::Invalid(message),
                401 | 403 => KubeError::Unauthorized(format!(
                    "{message}; the operator's ServiceAccount needs a Role for this kind in the namespace (see docs/plugin-authoring.md)"
                )),
                _ => KubeError::Transport(message),
            }
        }
        other => KubeError::Transport(format!("{what}: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(namespace: &str, kinds: &[&str]) -> KubeGrant {
        KubeGrant {
            namespace: namespace.into(),
            kinds: kinds.iter().map(|k| k.to_string()).collect(),
            scheduling: None,
            quota: None,
            images: None,
        }
    }

    fn bound(grant: &KubeGrant) -> KubeCapability {
        KubeCapability::bind(
            "p",
            Some(&ValidKubeGrant::parse(grant).unwrap()),
            None,
            Arc::default(),
            true,
        )
    }

    #[test]
    fn grants_name_the_field_that_is_wrong() {
        let error = |g: KubeGrant| ValidKubeGrant::parse(&g).unwrap_err().to_string();
        assert!(error(grant("Proxies", &["v1/Pod"])).contains("grants.kube.namespace"));
        assert!(error(grant("proxies", &[])).contains("grants.kube.kinds: empty"));
        assert!(error(grant("proxies", &["Pod"])).contains("kinds[0]: `Pod`"));
        assert!(error(grant("proxies", &["v1/pod"])).contains("kinds[0]"));
        assert!(
            error(grant("proxies", &["v1/Pod", "v1/Secret"])).contains("kinds[1]: Secrets cannot")
        );
        assert!(error(grant("proxies", &["v1/Endpoints"])).contains("kinds[0]: Endpoints cannot"));
        assert!(
            error(grant("proxies", &["discovery.k8s.io/v1/EndpointSlice"]))
                .contains("EndpointSlice cannot")
        );
        // Issue #47: only kinds the host has a policy for; the refusal names the kind and the list.
        for (index, unknown) in [
            "rbac.authorization.k8s.io/v1/RoleBinding",
            "v1/ServiceAccount",
            "networking.k8s.io/v1/Ingress",
            "gateway.networking.k8s.io/v1/HTTPRoute",
            "apps/v1/DaemonSet",
            "coordination.k8s.io/v1/Lease",
            "rbac.authorization.k8s.io/v1/ClusterRole",
            "example.com/v1/Widget",
        ]
        .into_iter()
        .enumerate()
        {
            let mut kinds = vec!["v1/Pod"; index];
            kinds.push(unknown);
            let message = error(grant("proxies", &kinds));
            assert!(
                message.starts_with(&format!(
                    "grants.kube.kinds[{index}]: `{unknown}` is not a kind the host has a policy for"
                )) && message.contains("v1/Pod, v1/ConfigMap, v1/Service")
                    && message.contains("policy/v1/PodDisruptionBudget"),
                "{message}"
            );
        }
        let images = |images: &[&str]| KubeGrant {
            images: Some(images.iter().map(|i| i.to_string()).collect()),
            ..grant("proxies", &["v1/Pod"])
        };
        assert!(error(images(&[])).starts_with("grants.kube.images: empty"));
        for (entry, says) in [
            (
                "squid",
                "grants.kube.images[0]: `squid` names no tag or digest",
            ),
            ("registry.example:5000/squid", "names no tag or digest"),
            ("docker.io/ubuntu/squid*:6", "not an image reference"),
            (
                "docker.io/ubuntu/squid:6*",
                "`*` stands only for a whole tag",
            ),
            ("squid:*@sha256:*", "`*` stands only for a whole tag"),
            ("Squid:6", "not an image reference"),
            ("squid:6 ", "not an image reference"),
            ("squid@md5:00", "a digest is sha256:<hex>"),
        ] {
            assert!(
                error(images(&[entry])).contains(says),
                "{entry}: {}",
                error(images(&[entry]))
            );
        }
        let default = ValidKubeGrant::parse(&grant("proxies", &["v1/Pod"])).unwrap();
        assert_eq!(
            default
                .images
                .iter()
                .map(|i| i.text.as_str())
                .collect::<Vec<_>>(),
            crate::provider::capabilities::grants::DEFAULT_IMAGES
        );
        let ok = bound(&grant("proxies", &["v1/Pod", "apps/v1/Deployment"]));
        assert_eq!(ok.namespace(), "proxies");
        assert_eq!(
            ok.kinds[1],
            ("apps/v1".to_string(), "Deployment".to_string())
        );
    }

    #[tokio::test]
    async fn calls_outside_the_grant_are_denied_before_any_request() {
        let none = KubeCapability::bind("p", None, None, Arc::default(), true);
        assert!(
            matches!(none.get("v1", "Pod", "x").await, Err(KubeError::Denied(m)) if m.contains("grants.kube"))
        );
        let pods = bound(&grant("proxies", &["v1/Pod"]));
        assert!(
            matches!(pods.get("v1", "ConfigMap", "x").await, Err(KubeError::Denied(m)) if m.contains("not in grants.kube.kinds (v1/Pod)"))
        );
        // Granted, but no cluster (no client).
        assert!(
            matches!(pods.list("v1", "Pod", None).await, Err(KubeError::Denied(m)) if m.contains("no Kubernetes cluster"))
        );
        let other_namespace =
            r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","namespace":"kube-system"}}"#;
        assert!(
            matches!(pods.apply(other_namespace).await, Err(KubeError::Denied(m)) if m.contains("namespace kube-system is not granted"))
        );
        assert!(matches!(pods.apply("{}").await, Err(KubeError::Invalid(_))));
        // Names go into the request's path: checked by the kind's rules before any request.
        for name in ["..", "a/status", "a?watch=1", "A", "", "a%2Fb"] {
            assert!(
                matches!(pods.get("v1", "Pod", name).await, Err(KubeError::Invalid(m)) if m.contains("not a DNS-1123 subdomain")),
                "{name}"
            );
            assert!(matches!(
                pods.delete("v1", "Pod", name).await,
                Err(KubeError::Invalid(_))
            ));
        }
        let bad = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"../secrets/x"}}"#;
        assert!(
            matches!(pods.apply(bad).await, Err(KubeError::Invalid(m)) if m.contains("`../secrets/x`"))
        );
        let services = bound(&grant("proxies", &["v1/Service"]));
        assert!(
            matches!(services.get("v1", "Service", "a.b").await, Err(KubeError::Invalid(m)) if m.contains("DNS-1035"))
        );
    }
}

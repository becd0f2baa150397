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
    /// The container images the plugin's Pods may run (exact references, or a repository with
    /// `:*` or `@sha256:*`); default [`DEFAULT_IMAGES`].
    #[serde(default)]
    pub images: Option<Vec<String>>,
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

/// The images a plugin's Pods may run when the grant names none: the kubernetes provider's
/// documented squid image (docs/providers/kubernetes.md).
pub const DEFAULT_IMAGES: &[&str] = &["docker.io/ubuntu/squid:6.6-24.04_beta"];

/// How the host confines an object of one kind: what in it selects, and where its templates are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KindPolicy {
    /// Data only (a ConfigMap): its labels and annotations.
    Data,
    /// A Pod: its spec passes the Pod allow-list.
    Pod,
    /// A Service: selects the instance's own Pods; no external IPs, names or chosen IPs.
    Service,
    /// A NetworkPolicy: applies to the instance's own Pods.
    NetworkPolicy,
    /// `spec.selector` (a label selector) and `spec.template` (a Pod template): Deployment,
    /// ReplicaSet, StatefulSet.
    Workload,
    /// `spec.selector` (a map of labels, defaulted from the template's) and `spec.template`.
    ReplicationController,
    /// `spec.template`, and `spec.selector` with `manualSelector`.
    Job,
    /// `spec.jobTemplate` (a Job template) with its Pod template.
    CronJob,
    /// `template` (a Pod template) at the top.
    PodTemplate,
    /// `spec.selector` (a label selector): which Pods it keeps from eviction.
    PodDisruptionBudget,
}

/// A kind the host knows, with the policy it confines it by.
#[derive(Debug, Clone, Copy)]
pub struct KnownKind {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub policy: KindPolicy,
}

const fn known(api_version: &'static str, kind: &'static str, policy: KindPolicy) -> KnownKind {
    KnownKind {
        api_version,
        kind,
        policy,
    }
}

/// Every kind a grant may name: what a proxy needs (its Pods, their config, the Service and
/// NetworkPolicy in front of them) and the controllers that make Pods, each with its policy.
/// Anything else (RoleBinding, ServiceAccount, Ingress, Gateway routes, a custom resource …) is
/// refused when the providers config is loaded: no policy of the host looks at it.
pub const KNOWN_KINDS: &[KnownKind] = &[
    known("v1", "Pod", KindPolicy::Pod),
    known("v1", "ConfigMap", KindPolicy::Data),
    known("v1", "Service", KindPolicy::Service),
    known(
        "networking.k8s.io/v1",
        "NetworkPolicy",
        KindPolicy::NetworkPolicy,
    ),
    known("apps/v1", "Deployment", KindPolicy::Workload),
    known("apps/v1", "ReplicaSet", KindPolicy::Workload),
    known("apps/v1", "StatefulSet", KindPolicy::Workload),
    known("batch/v1", "Job", KindPolicy::Job),
    known("batch/v1", "CronJob", KindPolicy::CronJob),
    known(
        "v1",
        "ReplicationController",
        KindPolicy::ReplicationController,
    ),
    known("v1", "PodTemplate", KindPolicy::PodTemplate),
    known(
        "policy/v1",
        "PodDisruptionBudget",
        KindPolicy::PodDisruptionBudget,
    ),
];

impl KindPolicy {
    /// The policy of a known kind; `None` for any other.
    pub fn of(api_version: &str, kind: &str) -> Option<KindPolicy> {
        KNOWN_KINDS
            .iter()
            .find(|k| k.api_version == api_version && k.kind == kind)
            .map(|k| k.policy)
    }
}

/// The known kinds as `apiVersion/Kind`, for messages.
pub fn known_kinds_list() -> String {
    KNOWN_KINDS
        .iter()
        .map(|k| format!("{}/{}", k.api_version, k.kind))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A `grants.kube` that cannot be used; the message starts with the field (after `grants.kube.`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KubeGrantError {
    #[error(
        "namespace: `{0}` is not a namespace name (lowercase letters, digits and '-', at most 63)"
    )]
    Namespace(String),
    #[error("kinds: empty; list the kinds the plugin may use, e.g. [v1/Pod, v1/ConfigMap]")]
    NoKinds,
    #[error("kinds[{index}]: `{entry}` is not apiVersion/Kind, e.g. v1/Pod or apps/v1/Deployment")]
    NotAKind { index: usize, entry: String },
    #[error("kinds[{index}]: {why}")]
    NeverGranted { index: usize, why: &'static str },
    #[error(
        "kinds[{index}]: `{entry}` is not a kind the host has a policy for, so it cannot be granted (nothing would check what the plugin makes of it); grant only kinds of this list: {known}"
    )]
    UnknownKind {
        index: usize,
        entry: String,
        known: String,
    },
    #[error("scheduling.tolerations[{index}].operator: `{operator}`; use Equal or Exists")]
    TolerationOperator { index: usize, operator: String },
    #[error(
        "scheduling.tolerations[{index}]: an empty key with Exists tolerates every taint; name the taint's key"
    )]
    TolerateEverything { index: usize },
    #[error("quota: 0 allows nothing; give at least 1 (or leave it out for the default)")]
    ZeroQuota,
    #[error("images[{index}]: {message}")]
    Image { index: usize, message: String },
    #[error(
        "images: empty, so no Pod could run; list the images the plugin's Pods may run (or leave it out for the default, {default})"
    )]
    NoImages { default: String },
}

/// A Kubernetes kind, e.g. `apps/v1` `Deployment`, and how the host confines it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KubeKind {
    pub api_version: String,
    pub kind: String,
    pub policy: KindPolicy,
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
    /// The images the plugin's Pods may run.
    pub images: Vec<ImagePattern>,
}

impl ValidKubeGrant {
    /// Checks the namespace and each kind (known to the host; Secrets never); no I/O.
    pub fn parse(grant: &KubeGrant) -> Result<Self, GrantError> {
        Self::check(grant).map_err(|e| GrantError::Kube(e.to_string()))
    }

    fn check(grant: &KubeGrant) -> Result<Self, KubeGrantError> {
        if !is_dns_label(&grant.namespace) {
            return Err(KubeGrantError::Namespace(grant.namespace.clone()));
        }
        if grant.kinds.is_empty() {
            return Err(KubeGrantError::NoKinds);
        }
        let kinds = grant
            .kinds
            .iter()
            .enumerate()
            .map(|(index, entry)| KubeKind::parse(index, entry))
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
                return Err(KubeGrantError::TolerationOperator { index, operator });
            }
            if toleration.key.is_empty() && operator == "Exists" {
                return Err(KubeGrantError::TolerateEverything { index });
            }
            tolerations.push(Toleration {
                operator: Some(operator),
                ..toleration
            });
        }
        let quota = grant.quota.unwrap_or_default();
        if quota.objects == Some(0) || quota.mebibytes == Some(0) {
            return Err(KubeGrantError::ZeroQuota);
        }
        let images = match &grant.images {
            None => DEFAULT_IMAGES
                .iter()
                .map(|image| ImagePattern::parse(image).expect("the default image is valid"))
                .collect(),
            Some(images) if images.is_empty() => {
                return Err(KubeGrantError::NoImages {
                    default: DEFAULT_IMAGES.join(", "),
                });
            }
            Some(images) => images
                .iter()
                .enumerate()
                .map(|(index, image)| {
                    ImagePattern::parse(image)
                        .map_err(|message| KubeGrantError::Image { index, message })
                })
                .collect::<Result<Vec<_>, _>>()?,
        };
        Ok(ValidKubeGrant {
            namespace: grant.namespace.clone(),
            kinds,
            node_selector_keys,
            tolerations,
            quota_objects: quota.objects.unwrap_or(DEFAULT_QUOTA_OBJECTS) as usize,
            quota_bytes: (quota.mebibytes.unwrap_or(DEFAULT_QUOTA_MEBIBYTES) as usize) << 20,
            images,
        })
    }
}

impl KubeKind {
    /// `apps/v1/Deployment` → (`apps/v1`, `Deployment`), if the host knows the kind.
    fn parse(index: usize, entry: &str) -> Result<Self, KubeGrantError> {
        let not_a_kind = || KubeGrantError::NotAKind {
            index,
            entry: entry.to_string(),
        };
        let (api_version, kind) = entry.rsplit_once('/').ok_or_else(not_a_kind)?;
        let valid_version = !api_version.is_empty()
            && api_version.split('/').count() <= 2
            && !api_version.contains(char::is_whitespace);
        if !valid_version || kind.is_empty() || !kind.starts_with(|c: char| c.is_ascii_uppercase())
        {
            return Err(not_a_kind());
        }
        if api_version == "v1" && kind == "Secret" {
            return Err(KubeGrantError::NeverGranted {
                index,
                why: "Secrets cannot be granted: a plugin never sees a secret; let the host add credentials (grants.http.credentials)",
            });
        }
        // Hand-written endpoints attach any address to any Service of the namespace, including
        // Services that are not the plugin's: Services select their Pods (the host checks it).
        if matches!(
            (api_version, kind),
            ("v1", "Endpoints") | ("discovery.k8s.io/v1", "EndpointSlice")
        ) {
            return Err(KubeGrantError::NeverGranted {
                index,
                why: if kind == "Endpoints" {
                    "Endpoints cannot be granted: endpoints written by hand would attach addresses to other Services of the namespace; a plugin's Services select its Pods"
                } else {
                    "EndpointSlice cannot be granted: endpoints written by hand would attach addresses to other Services of the namespace; a plugin's Services select its Pods"
                },
            });
        }
        let Some(policy) = KindPolicy::of(api_version, kind) else {
            return Err(KubeGrantError::UnknownKind {
                index,
                entry: entry.to_string(),
                known: known_kinds_list(),
            });
        };
        Ok(KubeKind {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            policy,
        })
    }
}

/// A container image reference as the container runtime reads it: `ubuntu/squid:6` is
/// `docker.io/ubuntu/squid:6`, `squid` is `docker.io/library/squid:latest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// `registry/path`, e.g. `docker.io/ubuntu/squid`.
    pub repository: String,
    /// The tag (`latest` when neither a tag nor a digest is given).
    pub tag: Option<String>,
    /// `sha256:…`.
    pub digest: Option<String>,
}

impl ImageRef {
    /// Reads an image reference; `Err` says why it is not one.
    pub fn parse(text: &str) -> Result<ImageRef, String> {
        if text.is_empty() || text.len() > 512 {
            return Err("an image reference is 1 to 512 characters".into());
        }
        let allowed = |c: char| c.is_ascii_alphanumeric() || "._-/:@*".contains(c);
        if let Some(bad) = text.chars().find(|c| !allowed(*c)) {
            return Err(format!(
                "`{}` is not an image reference (character {:?})",
                text.escape_debug(),
                bad
            ));
        }
        let (rest, digest) = match text.split_once('@') {
            Some((rest, digest)) => (rest, Some(digest.to_string())),
            None => (text, None),
        };
        let name_start = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[name_start..].rfind(':') {
            Some(i) => (
                &rest[..name_start + i],
                Some(rest[name_start + i + 1..].to_string()),
            ),
            None => (rest, None),
        };
        let (registry, path) = match name.split_once('/') {
            Some((first, path))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first, path.to_string())
            }
            _ if name.contains('/') => ("docker.io", name.to_string()),
            _ => ("docker.io", format!("library/{name}")),
        };
        let registry = if registry == "index.docker.io" {
            "docker.io"
        } else {
            registry
        };
        let valid_path = !path.is_empty()
            && path.split('/').all(|part| {
                !part.is_empty()
                    && part
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
            });
        if !valid_path || registry.is_empty() || tag.as_deref() == Some("") {
            return Err(format!("`{text}` is not an image reference"));
        }
        if let Some(digest) = &digest
            && !digest.starts_with("sha256:")
        {
            return Err(format!("`{text}`: a digest is sha256:<hex>"));
        }
        let tag = match (&tag, &digest) {
            (None, None) => Some("latest".to_string()),
            _ => tag,
        };
        Ok(ImageRef {
            repository: format!("{registry}/{path}"),
            tag,
            digest,
        })
    }
}

/// One entry of `grants.kube.images`: an exact reference (`repo:tag`, `repo@sha256:…`), every
/// tag of a repository (`repo:*`) or every digest of it (`repo@sha256:*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImagePattern {
    /// As written in the grant, for messages.
    pub text: String,
    reference: ImageRef,
}

impl ImagePattern {
    pub fn parse(text: &str) -> Result<ImagePattern, String> {
        if !text.contains([':', '@'])
            || text
                .rsplit_once('/')
                .is_some_and(|(_, last)| !last.contains([':', '@']))
        {
            return Err(format!(
                "`{text}` names no tag or digest; pin one (e.g. {}), or allow every tag with `:*`",
                DEFAULT_IMAGES[0]
            ));
        }
        let reference = ImageRef::parse(text)?;
        let wild = |part: &Option<String>, whole: &str| {
            part.as_deref()
                .is_some_and(|p| p.contains('*') && p != whole)
        };
        if reference.repository.contains('*')
            || wild(&reference.tag, "*")
            || wild(&reference.digest, "sha256:*")
            || (reference.tag.as_deref() == Some("*") && reference.digest.is_some())
        {
            return Err(format!(
                "`{text}`: `*` stands only for a whole tag (`repo:*`) or a whole digest (`repo@sha256:*`)"
            ));
        }
        Ok(ImagePattern {
            text: text.to_string(),
            reference,
        })
    }

    /// Whether a Pod's image is this entry's.
    pub fn admits(&self, image: &ImageRef) -> bool {
        let pattern = &self.reference;
        if image.repository != pattern.repository
            || image.tag.as_deref() == Some("*")
            || image.digest.as_deref().is_some_and(|d| d.contains('*'))
        {
            return false;
        }
        if pattern.tag.as_deref() == Some("*") {
            return true;
        }
        match pattern.digest.as_deref() {
            Some("sha256:*") => image.digest.is_some(),
            Some(digest) => image.digest.as_deref() == Some(digest),
            None => image.digest.is_none() && image.tag == pattern.tag,
        }
    }
}

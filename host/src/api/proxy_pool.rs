//! `ProxyPool`: keeps N healthy Proxies made from one template, rotates them by age and replaces
//! the ones crawlers keep reporting blocked (see docs/pools.md).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ProxySpec;

/// The most Proxies one pool may ask for. A pool is meant for one crawler fleet; a mistyped
/// `replicas: 100000` would otherwise ask a cloud for a hundred thousand VMs.
pub const MAX_POOL_REPLICAS: i32 = 10_000;

/// A pool of Proxies made from one template, kept at `replicas` healthy ones.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "proxy-operator.dev",
    version = "v1alpha1",
    kind = "ProxyPool",
    plural = "proxypools",
    shortname = "pp",
    category = "crawl",
    namespaced,
    status = "ProxyPoolStatus",
    doc = "A pool of Proxies made from one template, kept at `replicas` healthy ones, spread over providers and zones, rotated and recycled; crawlers lease from it by name.",
    selectable = ".spec.template.spec.provider",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn = r#"{"name":"Desired","type":"integer","jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyReplicas"}"#,
    printcolumn = r#"{"name":"Leased","type":"integer","jsonPath":".status.leasedReplicas"}"#,
    printcolumn = r#"{"name":"Up-to-date","type":"integer","jsonPath":".status.updatedReplicas"}"#,
    printcolumn = r#"{"name":"Capped","type":"string","description":"True while a provider instance's cap (limits in the providers config) holds the pool below its replicas","jsonPath":".status.conditions[?(@.type==\"CapReached\")].status"}"#,
    printcolumn = r#"{"name":"Provider","type":"string","jsonPath":".spec.template.spec.provider"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::api::kubernetes_formats)]
pub struct ProxyPoolSpec {
    /// How many Proxies the pool keeps (not counting ones being drained). `kubectl scale
    /// pp/NAME --replicas=N` sets it, so a HorizontalPodAutoscaler can drive it.
    #[schemars(range(min = 0, max = 10000))]
    pub replicas: i32,

    /// What each Proxy of the pool is made from. A change rolls the pool: new Proxies are made
    /// and the old ones drained, within `maxSurge` / `maxUnavailable`.
    pub template: ProxyTemplate,

    /// Replace a Proxy this long after it was made (rotation by age, a new exit IP), as a
    /// duration such as `24h` or `90m`; at least `1m`. Absent: Proxies are kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1m')").message("expireAfter must be at least 1m (a duration such as 30m or 24h)"))]
    #[schemars(regex(pattern = r"^([0-9]+(ns|us|ms|s|m|h))+$"), length(max = 32))]
    pub expire_after: Option<String>,

    /// Replace a Proxy after this many `blocked` reports from crawlers (to get a new exit IP).
    /// Absent: blocked Proxies only cool down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub recycle_after: Option<u32>,

    /// At most this many Proxies (or this percentage of `replicas`, rounded up) are made above
    /// `replicas` while replacing old ones. Default 25%.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_surge: Option<IntOrString>,

    /// At most this many of `replicas` (or this percentage, rounded down) may be missing from the
    /// Ready ones while replacing old ones. Default 0: a replacement is Ready before the Proxy it
    /// replaces is drained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,

    /// Where to spread the pool's Proxies: each entry sets the provider and/or zone of the
    /// template, and new Proxies go to the entry with the fewest. Empty: all as the template says.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub spread: Vec<SpreadTarget>,

    /// How the gateway (`proxy-operator gateway`, docs/gateway.md) shares the pool's Proxies.
    /// Absent: the operator's defaults (`--gateway-max-connections-per-proxy`,
    /// `--gateway-block-statuses`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<PoolGatewaySpec>,
}

/// How the gateway shares a pool's Proxies and what it counts as a site's block.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::api::kubernetes_formats)]
pub struct PoolGatewaySpec {
    /// Open gateway connections one Proxy of the pool carries at most; `0` keeps the pool for
    /// exclusive leases (the gateway never routes to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 100000))]
    pub max_connections_per_proxy: Option<u32>,

    /// Statuses of a plain-HTTP response that mean the site blocked the Proxy: the Proxy cools
    /// down for that host, as a crawler's `blocked` report would. Empty: no status is a block
    /// (only `blockBodyPatterns`). Absent: the operator's `--gateway-block-statuses` (default
    /// 403 and 429).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16), inner(range(min = 100, max = 599)))]
    pub block_statuses: Option<Vec<u16>>,

    /// Texts that, found in the start of a plain-HTTP response's body (its first 32 KiB as
    /// sent, ASCII case ignored), mean the site blocked the Proxy whatever the status, e.g. a
    /// captcha page answered with 200. A compressed body is not decoded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 256)))]
    pub block_body_patterns: Vec<String>,
}

/// Labels and annotations every Proxy of the pool gets.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMetadata {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// A Proxy as the pool makes it.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyTemplate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMetadata>,
    /// A Proxy's spec. Unlike a Proxy's own, every field may change: the pool replaces its
    /// Proxies instead.
    #[schemars(schema_with = "editable_proxy_spec")]
    pub spec: ProxySpec,
}

/// One place to spread Proxies to.
#[derive(
    Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct SpreadTarget {
    /// A provider instance (overrides the template's `provider`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub provider: Option<String>,
    /// A zone (overrides the template's `placement.zone`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub zone: Option<String>,
}

/// What the pool controller observed.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::api::kubernetes_formats)]
pub struct ProxyPoolStatus {
    /// Proxies of the pool that are not being drained or deleted.
    #[serde(default)]
    pub replicas: i32,
    /// Of those, the Ready ones.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Proxies of the pool holding a lease (draining ones included).
    #[serde(default)]
    pub leased_replicas: i32,
    /// Proxies made from the current template (and spread).
    #[serde(default)]
    pub updated_replicas: i32,
    /// Proxies taking no new leases, removed once their lease ends.
    #[serde(default)]
    pub draining_replicas: i32,
    /// The label selector of the pool's Proxies, for the scale subresource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` and `Progressing`, each with a reason and message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// A Proxy's spec schema without its `x-kubernetes-validations`: those are transition rules
/// that make a Proxy's fields immutable, which a pool's template must not be (a change rolls
/// the pool). Field-level bounds (lengths, patterns, ranges) stay.
fn editable_proxy_spec(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = <ProxySpec as JsonSchema>::json_schema(generator);
    strip_transition_rules(&mut schema);
    schema
}

fn strip_transition_rules(schema: &mut schemars::Schema) {
    if let Some(object) = schema.as_object_mut() {
        object.remove("x-kubernetes-validations");
    }
    schemars::transform::transform_subschemas(&mut strip_transition_rules, schema);
}

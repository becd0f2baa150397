//! `Proxy`: one egress proxy made by a provider instance.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A squid proxy made by a provider instance, probed, and handed out to crawlers.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "proxy-operator.dev",
    version = "v1alpha1",
    kind = "Proxy",
    plural = "proxies",
    shortname = "px",
    category = "crawl",
    namespaced,
    status = "ProxyStatus",
    doc = "An egress proxy (squid) made by a provider instance of the operator's providers config, probed with a real CONNECT and leased to crawlers through the discovery API.",
    selectable = ".spec.provider",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Provider","type":"string","jsonPath":".spec.provider"}"#,
    printcolumn = r#"{"name":"Address","type":"string","jsonPath":".status.address"}"#,
    printcolumn = r#"{"name":"Exit-IP","type":"string","priority":1,"jsonPath":".status.exitIP"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
// No `deny_unknown_fields`: the CRD's structural schema validates what users write, and a field
// from a newer CRD must not make this operator fail to list every Proxy.
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::api::kubernetes_formats)]
// What the instance was made from cannot change under it: the operator would have to ignore the
// edit (while `observedGeneration` moved as if it were applied) or replace a running proxy.
// Refused by the API server instead, with the way out in the message. `recreateOnLoss` stays
// editable: it is read when the instance is lost.
#[x_kube(validation = Rule::new("has(self.placement) == has(oldSelf.placement) && (!has(self.placement) || self.placement == oldSelf.placement)").message("spec.placement is immutable: the instance was made there; delete the Proxy and apply it again to move it"))]
#[x_kube(validation = Rule::new("self.port == oldSelf.port").message("spec.port is immutable: squid listens on it; delete the Proxy and apply it again to change it"))]
#[x_kube(validation = Rule::new("has(self.cloudInit) == has(oldSelf.cloudInit) && (!has(self.cloudInit) || self.cloudInit == oldSelf.cloudInit)").message("spec.cloudInit is immutable: it ran when the instance was made; delete the Proxy and apply it again to change it"))]
#[x_kube(validation = Rule::new("has(self.vendorData) == has(oldSelf.vendorData) && (!has(self.vendorData) || self.vendorData == oldSelf.vendorData)").message("spec.vendorData is immutable: it ran when the instance was made; delete the Proxy and apply it again to change it"))]
#[x_kube(validation = Rule::new("self.installGuestAgent == oldSelf.installGuestAgent").message("spec.installGuestAgent is immutable: delete the Proxy and apply it again to change it"))]
#[x_kube(validation = Rule::new("has(self.providerOptions) == has(oldSelf.providerOptions) && (!has(self.providerOptions) || self.providerOptions == oldSelf.providerOptions)").message("spec.providerOptions is immutable: the provider made the instance with them; delete the Proxy and apply it again to change them"))]
pub struct ProxySpec {
    /// The provider instance that makes this proxy: a `name` from the operator's providers config
    /// (e.g. `kvm-home`). Immutable: to move a proxy, create a new one.
    #[x_kube(validation = Rule::new("self == oldSelf").message("provider is immutable; create a new Proxy to use another provider"))]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub provider: String,

    /// Where and on what the proxy runs; each provider documents which fields it uses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,

    /// cloud-init user-data, passed to the provider byte for byte. At most 262144 characters
    /// (256 KiB), so a Proxy always fits in etcd's 1.5 MiB request limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 262144))]
    pub cloud_init: Option<String>,

    /// cloud-init vendor-data, merged by cloud-init with the provider's own. At most 262144
    /// characters (256 KiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 262144))]
    pub vendor_data: Option<String>,

    /// Install the QEMU guest agent (VM providers use it to learn the address). Default true.
    #[serde(default = "default_true")]
    pub install_guest_agent: bool,

    /// TCP port squid listens on. Default 3128.
    #[serde(default = "default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,

    /// What to do when the provider reports the recorded instance gone (deleted behind the
    /// operator's back): `false` (default) marks the Proxy `Failed` with reason `InstanceLost`;
    /// `true` creates a new instance.
    #[serde(default)]
    pub recreate_on_loss: bool,

    /// Provider-specific settings, passed to the provider as a JSON object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_object")]
    pub provider_options: Option<serde_json::Value>,
}

fn default_true() -> bool {
    true
}

fn default_port() -> u16 {
    3128
}

fn free_form_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// Where and on what a proxy runs.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
// As `ProxySpec`: unknown fields (a newer CRD) are the schema's to judge, not this operator's.
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// Zone (cloud) or hypervisor group (kvm) to place the proxy in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub zone: Option<String>,
    /// Image: a key of the provider's image map, or a URL where the provider allows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    pub image: Option<String>,
    /// Machine type or size, in the provider's terms (e.g. `e2-small`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub machine_type: Option<String>,
}

/// Where a proxy stands in its lifecycle.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    /// Accepted, not yet sent to the provider.
    Pending,
    /// The provider is making it; waiting for an address.
    Provisioning,
    /// Provisioned and passing health probes: leasable.
    Ready,
    /// Provisioned but failing health probes.
    Unhealthy,
    /// Being deleted at the provider.
    Deleting,
    /// Cannot proceed until the spec or the provider config changes; see conditions.
    Failed,
}

/// What the operator observed.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::api::kubernetes_formats)]
pub struct ProxyStatus {
    /// Lifecycle phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// `Provisioned`, `Healthy` and `Ready`, each with a reason and message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The provider's identifier of the instance, recorded as soon as it exists.
    #[serde(
        default,
        rename = "providerID",
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    /// Host or IP where squid answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// TCP port squid answers on at `address`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Zone the instance runs in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// What the operator asks the provider for, written before its first create call and asked
    /// again by every retry until `providerID` is recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<PlacementRecord>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When the last health probe ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe_time: Option<Time>,
    /// Latency of the last successful probe, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe_latency_ms: Option<u32>,
    /// The address the proxy's traffic leaves from, as the exit-IP service (`--exit-ip-url`) saw
    /// it; absent when that is not configured or not learned yet.
    #[serde(default, rename = "exitIP", skip_serializing_if = "Option::is_none")]
    pub exit_ip: Option<String>,
    /// The last error from the provider or the prober.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// The credentials squid requires (absent for a proxy without: one made by a provider built
    /// for WIT 0.1.0, or before credentials existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<CredentialsStatus>,
}

/// Which credentials a proxy's squid was given.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialsStatus {
    /// The Secret (in the Proxy's namespace) holding `username` and `password`. Change or delete
    /// its `password` to rotate them.
    pub secret_name: String,
    /// Identifies the credentials applied (a digest, not the password): when the Secret's differ,
    /// the operator rotates the proxy's.
    pub fingerprint: String,
}

/// The placement a create asks for. Recorded before the first create call, so that a retry
/// (after a restart, a timeout, a kill) asks the same provider for the same zone, whatever the
/// providers config says by then.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementRecord {
    /// The provider instance asked (`spec.provider`).
    pub provider: String,
    /// The zone asked for; absent: the provider chooses (and finds an earlier try's instance by
    /// its name in every zone it has).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

/// The Proxies one operator watches: those of `namespace`, or of every namespace.
pub fn proxies(client: kube::Client, namespace: Option<&str>) -> kube::Api<Proxy> {
    match namespace {
        Some(ns) => kube::Api::namespaced(client, ns),
        None => kube::Api::all(client),
    }
}

//! `ProviderHealth`: the health of one provider instance, as its `check()` reports it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Health of one provider instance of the providers config (one object per instance, named after
/// it). Written by the operator; `kubectl get ph` shows them all.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[kube(
    group = "proxy-operator.dev",
    version = "v1alpha1",
    kind = "ProviderHealth",
    plural = "providerhealths",
    shortname = "ph",
    status = "ProviderHealthStatus",
    doc = "The health of one provider instance of the operator's providers config (named after it), written by the operator from the provider's check().",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Targets","type":"string","jsonPath":".status.targetsSummary"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::api::kubernetes_formats)]
pub struct ProviderHealthSpec {
    /// The provider type (plugin) serving this provider instance.
    #[serde(default)]
    pub provider_type: String,
}

/// Result of the latest check.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::api::kubernetes_formats)]
pub struct ProviderHealthStatus {
    /// `Ready`, with a reason from a fixed set (see docs/architecture.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// One verdict per target the provider checked (a hypervisor, an API endpoint).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<TargetVerdict>,
    /// Targets OK over targets checked, e.g. `2/3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targets_summary: Option<String>,
    /// When the last check finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_check_time: Option<Time>,
}

/// One target's verdict.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetVerdict {
    /// What was checked.
    pub target: String,
    /// Whether it is usable.
    pub ok: bool,
    /// CamelCase reason.
    pub reason: String,
    /// Detail for a person.
    #[serde(default)]
    pub message: String,
    /// How long the check of this target took.
    #[serde(default)]
    pub latency_ms: u32,
}

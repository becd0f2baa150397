//! The custom resources of `proxy-operator.dev/v1alpha1`, as Rust types. The CRD manifests in
//! `deploy/crds/` are generated from them (`proxy-operator crds`), and a test fails when they drift.

pub(crate) mod conditions;
mod keys;
pub mod labels;
mod provider_health;
mod proxy;
mod proxy_pool;
mod proxy_quota;

pub use keys::{PoolKey, ProxyKey};
pub use provider_health::{
    ProviderHealth, ProviderHealthSpec, ProviderHealthStatus, TargetVerdict,
};
pub use proxy::{
    CredentialsStatus, Phase, Placement, PlacementRecord, Proxy, ProxySpec, ProxyStatus, proxies,
};
pub use proxy_pool::{
    MAX_POOL_REPLICAS, PoolGatewaySpec, ProxyPool, ProxyPoolSpec, ProxyPoolStatus, ProxyTemplate,
    SpreadTarget, TemplateMetadata,
};
pub use proxy_quota::{
    Bound, ProxyCounts, ProxyQuota, ProxyQuotaSpec, ProxyQuotaStatus, QuotaSummary, QuotaUse,
    proxy_headroom, tightest,
};

use kube::CustomResourceExt;

/// API group of every resource of the operator.
pub const GROUP: &str = "proxy-operator.dev";

/// When an object was created, in ms since the epoch (0 before the API server has set it):
/// the order caps and quotas admit waiting Proxies in, and a pool member's age.
pub fn created_ms(meta: &kube::api::ObjectMeta) -> u64 {
    meta.creation_timestamp
        .as_ref()
        .map_or(0, |t| t.0.as_millisecond().max(0) as u64)
}

/// Every CRD as YAML documents, in a stable order, as committed under `deploy/crds/`.
pub fn crd_manifests() -> Vec<(&'static str, String)> {
    vec![
        ("proxies.yaml", to_yaml(&Proxy::crd())),
        ("providerhealths.yaml", to_yaml(&ProviderHealth::crd())),
        ("proxypools.yaml", to_yaml(&ProxyPool::crd())),
        ("proxyquotas.yaml", to_yaml(&ProxyQuota::crd())),
    ]
}

/// A schemars transform that leaves only the `format`s Kubernetes knows (the API server warns
/// `unrecognized format "uint32"` for the rest): the integer widths schemars writes (`uint16`,
/// `uint32`, ...) become `int32` or `int64` with the type's bounds kept as `minimum` / `maximum`;
/// any other unknown format is dropped. Put on every type a CRD schema is made of
/// (`#[schemars(transform = crate::api::kubernetes_formats)]`); nested types are covered too.
pub(crate) fn kubernetes_formats(schema: &mut schemars::Schema) {
    if let Some(object) = schema.as_object_mut()
        && let Some(format) = object.get("format").and_then(|f| f.as_str())
    {
        let format = format.to_string();
        // `["integer", "null"]` for an `Option` (before kube rewrites it to `nullable`).
        let type_ = match object.get("type") {
            Some(serde_json::Value::String(t)) => t.clone(),
            Some(serde_json::Value::Array(types)) => types
                .iter()
                .filter_map(|t| t.as_str())
                .find(|t| *t != "null")
                .unwrap_or("")
                .to_string(),
            _ => String::new(),
        };
        let replacement = match type_.as_str() {
            "integer" if format == "int32" || format == "int64" => Some(format.as_str()),
            "integer" => integer_format(&format).map(|(known, min, max)| {
                object.entry("minimum").or_insert(min.into());
                if let Some(max) = max {
                    object.entry("maximum").or_insert(max.into());
                }
                known
            }),
            "number" if format == "float" || format == "double" => Some(format.as_str()),
            "number" => None,
            "" | "string" if KNOWN_STRING_FORMATS.contains(&format.replace('-', "").as_str()) => {
                Some(format.as_str())
            }
            _ => None,
        }
        .map(str::to_string);
        match replacement {
            Some(known) => {
                object.insert("format".into(), known.into());
            }
            None => {
                object.remove("format");
            }
        }
    }
    schemars::transform::transform_subschemas(&mut kubernetes_formats, schema);
}

/// The string formats Kubernetes validates (`-` removed, as it compares them), from
/// k8s.io/apiextensions-apiserver `validation/formats.go`.
const KNOWN_STRING_FORMATS: &[&str] = &[
    "bsonobjectid",
    "uri",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "cidr",
    "mac",
    "uuid",
    "uuid3",
    "uuid4",
    "uuid5",
    "isbn",
    "isbn10",
    "isbn13",
    "creditcard",
    "ssn",
    "hexcolor",
    "rgbcolor",
    "byte",
    "password",
    "date",
    "duration",
    "datetime",
];

/// The Kubernetes integer format for a schemars one, with the bounds that keep its range.
/// (`int64` has no bound to add, and `uint64` values above `i64::MAX` do not occur here.)
fn integer_format(format: &str) -> Option<(&'static str, i64, Option<i64>)> {
    Some(match format {
        "int8" => ("int32", i8::MIN.into(), Some(i8::MAX.into())),
        "uint8" => ("int32", 0, Some(u8::MAX.into())),
        "int16" => ("int32", i16::MIN.into(), Some(i16::MAX.into())),
        "uint16" => ("int32", 0, Some(u16::MAX.into())),
        "uint32" => ("int64", 0, Some(u32::MAX.into())),
        "uint64" | "uint" => ("int64", 0, None),
        _ => return None,
    })
}

fn to_yaml<T: serde::Serialize>(value: &T) -> String {
    let body = crate::support::yaml::to_string(value).expect("CRDs always serialize");
    format!("# Generated by `proxy-operator crds --out deploy/crds`; do not edit.\n{body}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `format` in the CRDs is one Kubernetes knows, so `kubectl apply -f deploy/crds/`
    /// prints no `unrecognized format` warning. The rule is the API server's
    /// (k8s.io/apiextensions-apiserver, `validation.GetUnrecognizedFormats`).
    #[test]
    fn crd_schemas_carry_only_formats_kubernetes_knows() {
        fn visit(value: &serde_json::Value, path: &str, unknown: &mut Vec<String>) {
            match value {
                serde_json::Value::Object(map) => {
                    if let Some(format) = map.get("format").and_then(|f| f.as_str()) {
                        let known = match map.get("type").and_then(|t| t.as_str()) {
                            Some("integer") => ["int32", "int64"].contains(&format),
                            Some("number") => ["float", "double"].contains(&format),
                            None | Some("string") => {
                                STRING_FORMATS.contains(&format.replace('-', "").as_str())
                            }
                            Some(_) => false,
                        };
                        if !known {
                            unknown.push(format!("{path}: {format}"));
                        }
                    }
                    for (key, child) in map {
                        visit(child, &format!("{path}.{key}"), unknown);
                    }
                }
                serde_json::Value::Array(items) => {
                    for (i, child) in items.iter().enumerate() {
                        visit(child, &format!("{path}[{i}]"), unknown);
                    }
                }
                _ => {}
            }
        }
        const STRING_FORMATS: &[&str] = &[
            "bsonobjectid",
            "uri",
            "email",
            "hostname",
            "ipv4",
            "ipv6",
            "cidr",
            "mac",
            "uuid",
            "uuid3",
            "uuid4",
            "uuid5",
            "isbn",
            "isbn10",
            "isbn13",
            "creditcard",
            "ssn",
            "hexcolor",
            "rgbcolor",
            "byte",
            "password",
            "date",
            "duration",
            "datetime",
            "k8sshortname",
            "k8slongname",
        ];
        let mut unknown = Vec::new();
        for (name, crd) in [
            ("proxies", serde_json::to_value(Proxy::crd()).unwrap()),
            (
                "providerhealths",
                serde_json::to_value(ProviderHealth::crd()).unwrap(),
            ),
            (
                "proxypools",
                serde_json::to_value(ProxyPool::crd()).unwrap(),
            ),
            (
                "proxyquotas",
                serde_json::to_value(ProxyQuota::crd()).unwrap(),
            ),
        ] {
            visit(&crd, name, &mut unknown);
        }
        assert!(
            unknown.is_empty(),
            "formats Kubernetes does not know: {unknown:#?}"
        );
    }

    /// The committed manifests must be what the types generate: run
    /// `cargo run -p proxy-operator --bin proxy-operator -- crds --out deploy/crds` after changing a type.
    #[test]
    fn committed_crds_match_the_types() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
        for (file, generated) in crd_manifests() {
            let committed = std::fs::read_to_string(dir.join(file))
                .unwrap_or_else(|e| panic!("deploy/crds/{file}: {e}"));
            assert!(
                committed == generated,
                "deploy/crds/{file} differs from the Rust types; regenerate it with \
                 `cargo run -p proxy-operator --bin proxy-operator -- crds --out deploy/crds`"
            );
        }
    }
}

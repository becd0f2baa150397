//! The discovery API's bodies as they are on the wire: what a request may send (every field
//! optional, unknown ones refused) and what a lease looks like in an answer.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::leasing::leases::store::{Lease, Outcome, PoolKey, ProvisionedProxy};
use crate::support::socks::ProxyProtocol;

/// Every field is optional, and `null` is the same as absent for each of them. Serialized as a
/// client sends it (`kubectl px lease`), without the fields it leaves out.
#[derive(Deserialize, Serialize, Default, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GrantBody {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selector: Option<BTreeMap<String, String>>,
    /// `namespace/name` of a particular proxy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy: Option<String>,
    /// `namespace/name` of a ProxyPool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// A sticky session key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The host the crawler will visit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    #[serde(
        default,
        deserialize_with = "whole_seconds",
        skip_serializing_if = "Option::is_none"
    )]
    pub ttl_seconds: Option<u64>,
}

/// A report on a lease, as the server reads it and a client sends it.
#[derive(Deserialize, Serialize, Default, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ReportBody {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
    /// With `blocked`: the host that blocked the proxy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RenewBody {
    #[serde(default, deserialize_with = "whole_seconds")]
    pub(super) ttl_seconds: Option<u64>,
}

/// `ttlSeconds`: a whole number of seconds. The OpenAPI document types it `integer`, which JSON
/// Schema admits as `30.0` too, so a number with no fraction is that integer, also past u64; a
/// fraction or a negative number is refused.
fn whole_seconds<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let Some(number) = Option::<serde_json::Number>::deserialize(d)? else {
        return Ok(None);
    };
    if let Some(seconds) = number.as_u64() {
        return Ok(Some(seconds));
    }
    match number.as_f64() {
        // Past u64 (the document sets no maximum) the cast saturates: the lease is clamped to
        // --max-lease-ttl like any long one.
        Some(f) if f.fract() == 0.0 && f >= 0.0 => Ok(Some(f as u64)),
        _ => Err(serde::de::Error::custom(format!(
            "invalid value: {number}, expected a whole number of seconds of at least 1"
        ))),
    }
}

/// Borrowed from the table's entry: an answer copies nothing it only serializes.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ProxyRef<'a> {
    namespace: &'a str,
    name: &'a str,
    provider: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    zone: Option<&'a str>,
    address: &'a str,
    port: u16,
    #[serde(rename = "exitIP", skip_serializing_if = "Option::is_none")]
    exit_ip: Option<&'a str>,
}

/// A lease as the API shows it: the answer to a grant, a renewal and `GET /v1/leases/{id}` (see
/// `Lease` in the OpenAPI document).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Granted<'a> {
    id: String,
    proxy: ProxyRef<'a>,
    proxy_url: String,
    granted_at: String,
    expires_at: String,
    ttl_seconds: u64,
    /// `namespace/name`, written without a string made for it.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "as_text")]
    pool: Option<PoolKey>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session: Option<Arc<str>>,
}

fn as_text<S: serde::Serializer>(key: &Option<PoolKey>, serializer: S) -> Result<S::Ok, S::Error> {
    match key {
        Some(key) => serializer.collect_str(key),
        None => serializer.serialize_none(),
    }
}

impl<'a> Granted<'a> {
    pub(super) fn new(lease: Lease, entry: &'a ProvisionedProxy) -> Self {
        let pool = lease.pool_key();
        Granted {
            // An upstream's login stays with the operator (and its gateway) unless allowed.
            proxy_url: match &entry.login {
                Some(login) if login.handed_out() => {
                    login.proxy_url(entry.protocol, &entry.address, entry.port)
                }
                _ => proxy_url(entry.protocol, &entry.address, entry.port),
            },
            granted_at: rfc3339(lease.granted_at_ms),
            expires_at: rfc3339(lease.expires_at_ms),
            ttl_seconds: if lease.ttl_ms > 0 {
                lease.ttl_ms / 1000
            } else {
                (lease.expires_at_ms - lease.granted_at_ms) / 1000
            },
            proxy: ProxyRef {
                namespace: &entry.key.namespace,
                name: &entry.key.name,
                provider: &entry.provider,
                zone: entry.zone.as_deref(),
                address: &entry.address,
                port: entry.port,
                exit_ip: entry.exit_ip.as_deref(),
            },
            pool,
            session: lease.session,
            id: lease.id,
        }
    }
}

pub(super) fn rfc3339(ms: u64) -> String {
    k8s_openapi::jiff::Timestamp::from_millisecond(ms as i64)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// `http://address:port` (or `socks5://`), without credentials.
pub(super) fn proxy_url(protocol: ProxyProtocol, address: &str, port: u16) -> String {
    let scheme = protocol.scheme();
    if address.contains(':') {
        format!("{scheme}://[{address}]:{port}")
    } else {
        format!("{scheme}://{address}:{port}")
    }
}

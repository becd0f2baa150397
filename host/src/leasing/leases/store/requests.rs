//! What the lease table is handed (the provisioned proxies) and asked (a grant), and what it
//! answers: the types its callers see.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::keys::{PoolKey, ProxyKey};
use super::outcomes::EndReason;
use super::records::Lease;

/// A provisioned proxy as the health engine sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct ProvisionedProxy {
    pub key: ProxyKey,
    pub provider: String,
    pub zone: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub address: String,
    pub port: u16,
    /// Where the proxy's traffic leaves from, when the health engine learned it.
    pub exit_ip: Option<String>,
    /// Passing health probes (the only proxies ever granted).
    pub healthy: bool,
    /// The ProxyPool (in the proxy's namespace) that made it: its [`POOL_LABEL`].
    pub pool: Option<String>,
    /// About to be removed by its pool ([`DRAINING_ANNOTATION`]): no new grant, session or
    /// renewal; its leases run out.
    pub draining: bool,
    /// The credentials its squid requires (in a lease's `proxyUrl`); none for a proxy without.
    pub login: Option<crate::provider::credentials::ProxyLogin>,
    /// How it is spoken to: HTTP, or SOCKS5 (an upstream one): a lease's `proxyUrl` scheme, and
    /// how the gateway connects through it.
    pub protocol: crate::support::socks::ProxyProtocol,
}

impl ProvisionedProxy {
    pub(super) fn leasable(&self) -> bool {
        self.healthy && !self.draining
    }
}

/// What a crawler asks for.
#[derive(Clone, Debug, Default)]
pub struct LeaseRequest {
    pub provider: Option<String>,
    pub zone: Option<String>,
    /// Every label must match.
    pub selector: BTreeMap<String, String>,
    /// A particular proxy.
    pub proxy: Option<ProxyKey>,
    /// Only proxies of this ProxyPool.
    pub pool: Option<PoolKey>,
    /// A sticky session: the proxy this key last had, while it is available (see
    /// [`validate_session`](super::validate_session)).
    pub session: Option<String>,
    /// The host the crawler will visit: proxies cooling down for it are skipped (see
    /// [`normalize_target`](super::normalize_target)).
    pub target: Option<String>,
    pub ttl: Option<Duration>,
    /// Who the lease is granted to (a Kubernetes username; `None`: the static token).
    pub holder: Option<String>,
    /// What the caller may lease from, decided before the table is asked: nothing outside it
    /// is granted, joined, routed to or told apart from a proxy that does not exist.
    pub reach: super::Reach,
}

/// A grant's answer.
#[derive(Clone, Debug)]
pub struct Grant {
    pub lease: Lease,
    /// Shared with the table: cloned under its lock, it is only a reference count.
    pub entry: Arc<ProvisionedProxy>,
    /// The session already held this lease, and it was handed out again: nothing new was
    /// granted (several workers of one session share one lease and one proxy).
    pub joined: bool,
}

/// Why a grant was refused.
#[derive(Clone, Debug, PartialEq)]
pub enum GrantError {
    /// Nothing matching is available; try again after this long.
    NoProxy { retry_after: Duration },
    /// No provisioned proxy, in any state, matches the request: waiting does not help.
    NoMatch,
    /// The named pool is neither a ProxyPool nor named by any proxy, or is outside the
    /// request's reach.
    UnknownPool,
    /// The named proxy cools down after a block (for the request's target) until then.
    CoolingDown { retry_after: Duration },
    /// The named proxy is leased to someone else.
    Leased { retry_after: Duration },
    /// The named proxy is being removed by its pool.
    Draining,
    /// The named proxy is not provisioned (or does not exist), or is outside the request's
    /// reach: the two are one answer, so a caller learns nothing of proxies it may not lease.
    UnknownProxy,
    /// The store has not restored its state yet (just started, or not the leader).
    NotReady,
    /// The proxy's namespace is at a ProxyQuota bound (`leases`, or `gatewayConnections` for a
    /// gateway route): what the refusal says (`ProxyQuota team-a/q1: leases 5/5 in use`).
    QuotaExceeded(String),
}

impl GrantError {
    pub fn reason(&self) -> &'static str {
        match self {
            GrantError::NoProxy { .. } => "no_proxy",
            GrantError::NoMatch => "no_match",
            GrantError::UnknownPool => "unknown_pool",
            GrantError::CoolingDown { .. } => "cooling_down",
            GrantError::Leased { .. } => "leased",
            GrantError::Draining => "draining",
            GrantError::UnknownProxy => "unknown_proxy",
            GrantError::NotReady => "not_ready",
            GrantError::QuotaExceeded(_) => "quota_exceeded",
        }
    }
}

/// Why a lease operation could not be applied.
#[derive(Clone, Debug, PartialEq)]
pub enum LeaseError {
    NotFound,
    Ended(EndReason),
    /// A renewal of a lease on a draining proxy.
    Draining,
    NotReady,
}

/// A proxy as `GET /v1/proxies` shows it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyView {
    pub namespace: String,
    pub name: String,
    pub provider: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    pub address: String,
    pub port: u16,
    pub exit_ip: Option<String>,
    /// `available`, `leased`, `coolingDown` or `unhealthy`.
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cooldown_until_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_expires_at_ms: Option<u64>,
    /// `namespace/name` of its ProxyPool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    pub draining: bool,
    /// Carrying gateway traffic (not leased exclusively meanwhile): its open gateway
    /// connections, over every gateway replica.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway_connections: Option<u32>,
    /// How it is spoken to (the scheme of its `proxyUrl` in `/v1/proxies`).
    #[serde(skip)]
    pub protocol: crate::support::socks::ProxyProtocol,
}

/// How crawlers use one proxy, for the pool controller (drain, recycle).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProxyUsage {
    /// When its lease ends, while it is leased.
    pub lease_expires_at_ms: Option<u64>,
    /// `blocked` reports on it (with or without a target) since it was provisioned.
    pub blocked_reports: u32,
}

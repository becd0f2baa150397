//! The gateway: one proxy endpoint for any client (`proxy-operator gateway`). It takes HTTP/1.1
//! forward-proxy requests, `CONNECT` tunnels and SOCKS5, reads who the client is (the password:
//! a token the discovery API accepts) and what it wants (the username: [`Routing`]), and carries
//! the traffic through an upstream proxy of the fleet that the leader picks ([`Routes`]), logging
//! in to it with credentials the client never sees.
//!
//! The data plane (the protocols, the relay, the destination policy) knows the fleet only
//! through [`Routes`]: the operator's implementation asks the leader's discovery API, tests use
//! a fixed set of real squids.

use std::future::Future;
use std::time::Duration;

pub mod block;
pub mod bytes;
pub mod client_report;
pub mod head;
pub mod http;
pub mod leader;
pub mod load;
pub mod metrics;
pub mod options;
pub mod policy;
pub mod prefetch;
pub mod relay;
pub mod server;
pub mod socks5;
pub mod upstream;
pub mod username;

/// What a client asked for in its proxy username (`pool-crawlers.egress,session-abc`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Routing {
    /// `(namespace, name)` of a ProxyPool.
    pub pool: Option<(String, String)>,
    /// A sticky session: the same upstream while it is usable.
    pub session: Option<String>,
    pub zone: Option<String>,
    pub provider: Option<String>,
}

/// Where a request or tunnel goes: the host as the client named it (a name is resolved by the
/// upstream proxy, never by the gateway) and the port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Destination {
    pub host: String,
    pub port: u16,
}

/// One request for an upstream.
#[derive(Clone)]
pub struct RouteRequest {
    pub routing: Routing,
    /// The client's password: a token the discovery API accepts. Never logged: `Debug` prints
    /// `<redacted>` in its place.
    pub token: String,
    pub destination: Destination,
    /// An upstream not to use (`namespace/name`): the one that just failed, on the retry.
    pub avoid: Option<String>,
}

impl std::fmt::Debug for RouteRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteRequest")
            .field("routing", &self.routing)
            .field("token", &"<redacted>")
            .field("destination", &self.destination)
            .field("avoid", &self.avoid)
            .finish()
    }
}

/// The credentials the gateway logs in to an upstream squid with.
#[derive(Clone, PartialEq, Eq)]
pub struct UpstreamLogin {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for UpstreamLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamLogin")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// The upstream proxy chosen for one request or tunnel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// The Proxy, `namespace/name`.
    pub proxy: String,
    /// Its ProxyPool, `namespace/name` (none: a Proxy of no pool): what its bytes count under.
    pub pool: Option<String>,
    pub address: String,
    pub port: u16,
    pub login: Option<UpstreamLogin>,
    /// How the gateway speaks to it: HTTP (`CONNECT`, absolute-form requests) or SOCKS5 (a
    /// SOCKS5 `CONNECT` to the destination, then the request in origin form).
    pub protocol: crate::support::socks::ProxyProtocol,
    /// Response statuses of plain-HTTP requests that mean "this site blocked the proxy" (the
    /// pool's; default 403 and 429): reported as `blocked` for the destination's host.
    pub block_statuses: Vec<u16>,
    /// Texts that, in the start of a plain-HTTP response's body, mean a block whatever the
    /// status (the pool's; ASCII case ignored).
    pub block_body_patterns: Vec<String>,
}

/// Why no upstream was chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteError {
    /// No token, or one the discovery API does not accept (HTTP 407, SOCKS5 auth failure).
    Unauthenticated,
    /// The token may not use what was asked (HTTP 403, SOCKS5 "not allowed by ruleset").
    Forbidden(String),
    /// The username asked for something that is malformed or that does not exist: the reason
    /// names the part (HTTP 407 with the reason, SOCKS5 auth failure).
    Invalid(String),
    /// Nothing matching is available now (HTTP 503 with Retry-After).
    NoProxy { retry_after: Duration },
    /// The leader could not be asked (HTTP 503).
    Unavailable(String),
    /// The pool's namespace has as many gateway connections open as a ProxyQuota of it allows
    /// (HTTP 429 naming the quota, the use and the limit; SOCKS5 "not allowed by ruleset").
    QuotaExceeded(String),
}

/// What a request through an upstream showed about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Report {
    /// The destination answered with one of the route's `block_statuses`, or a body with one
    /// of its `block_body_patterns`.
    Blocked,
    /// The upstream refused, timed out or answered 502/503/504 to the gateway.
    Failure,
}

impl Report {
    /// As the lease API's `outcome` names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Report::Blocked => "blocked",
            Report::Failure => "failure",
        }
    }
}

/// A client's own report on the upstream its session is on ([`client_report`]).
#[derive(Clone)]
pub struct SessionReport {
    /// The client's username: its session (required) and pool.
    pub routing: Routing,
    /// The client's token. Never logged.
    pub token: String,
    pub report: Report,
    /// The site's host.
    pub target: String,
}

/// Chooses upstreams and hears what happened on them.
pub trait Routes: Send + Sync + 'static {
    fn route(
        &self,
        request: &RouteRequest,
    ) -> impl Future<Output = Result<Route, RouteError>> + Send;

    /// Fire and forget: a report that cannot be delivered is logged, never the client's error.
    fn report(
        &self,
        route: &Route,
        destination: &Destination,
        report: Report,
    ) -> impl Future<Output = ()> + Send;

    /// A client's report, on the upstream its session is on: that upstream (`namespace/name`).
    fn report_session(
        &self,
        report: &SessionReport,
    ) -> impl Future<Output = Result<String, RouteError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A route request in a log line or a panic message never carries the client's token
    /// (docs/security.md, "The gateway").
    #[test]
    fn a_route_requests_debug_never_prints_the_token() {
        let request = RouteRequest {
            routing: Routing {
                pool: Some(("crawlers".into(), "egress".into())),
                session: Some("a1".into()),
                ..Default::default()
            },
            token: "s3cr3t-t0ken-value".into(),
            destination: Destination {
                host: "example.com".into(),
                port: 443,
            },
            avoid: Some("crawlers/egress-1".into()),
        };
        for shown in [format!("{request:?}"), format!("{request:#?}")] {
            assert!(!shown.contains("s3cr3t"), "{shown}");
            assert!(shown.contains("<redacted>"), "{shown}");
            assert!(
                shown.contains("example.com") && shown.contains("crawlers/egress-1"),
                "{shown}"
            );
        }
    }
}

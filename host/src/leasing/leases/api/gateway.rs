//! The gateway's side door into the discovery API (docs/gateway.md): routes, replica loads and
//! reports. Only a caller with the gateway token gets in; a route also needs the client's own
//! token, checked and authorized exactly as a lease grant is, so the gateway can do nothing for
//! a client that the client could not do through the lease API. Not in the OpenAPI document:
//! crawlers never call these.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;

use super::super::auth::Scope;
use super::super::store::shared::{ReplicaError, RouteRequest};
use super::gateway_access::GATEWAY_TOKEN_HEADER;
use super::{
    Authorized, Discovery, JsonBody, Problem, checked_session, checked_target, parse_key,
    required_outcome,
};
use crate::leasing::leases::store::{LeaseRequest, NO_POOL, Outcome, PoolTraffic, ProxyKey};

/// Longest replica id (a Pod name is at most 253).
const MAX_REPLICA_CHARS: usize = 253;
/// Most proxies one replica load report names.
const MAX_LOAD_ENTRIES: usize = 100_000;

/// A caller that presented the gateway token.
struct FromGateway;

impl FromRequestParts<Arc<Discovery>> for FromGateway {
    type Rejection = Problem;

    async fn from_request_parts(
        parts: &mut Parts,
        discovery: &Arc<Discovery>,
    ) -> Result<Self, Problem> {
        let Some(access) = &discovery.gateway else {
            return Err(Problem::new(
                StatusCode::NOT_FOUND,
                "gateway-disabled",
                "The gateway is not enabled",
                "the operator runs without --gateway-token; see docs/gateway.md".into(),
            ));
        };
        let presented = parts
            .headers
            .get(GATEWAY_TOKEN_HEADER)
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        if !bool::from(presented.ct_eq(access.token.as_bytes())) {
            return Err(Problem::new(
                StatusCode::FORBIDDEN,
                "not-the-gateway",
                "Only the gateway may call this",
                format!("{GATEWAY_TOKEN_HEADER}: missing or not the gateway's token"),
            ));
        }
        match discovery.standby_answer() {
            Some(problem) => Err(problem),
            None => Ok(FromGateway),
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RouteBody {
    replica: Option<String>,
    pool: Option<String>,
    provider: Option<String>,
    zone: Option<String>,
    session: Option<String>,
    /// The destination's host.
    target: Option<String>,
    /// `namespace/name` of a proxy not to use.
    avoid: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RouteAnswer<'a> {
    proxy: RoutedProxy<'a>,
    /// The proxy's ProxyPool (`namespace/name`): what the gateway counts its bytes under.
    #[serde(skip_serializing_if = "Option::is_none")]
    pool: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    login: Option<Login<'a>>,
    /// `http` or `socks5`: how the gateway speaks to the proxy.
    protocol: crate::support::socks::ProxyProtocol,
    block_statuses: &'a [u16],
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    block_body_patterns: &'a [String],
}

#[derive(Serialize)]
struct RoutedProxy<'a> {
    namespace: &'a str,
    name: &'a str,
    address: &'a str,
    port: u16,
}

#[derive(Serialize)]
struct Login<'a> {
    username: &'a str,
    password: &'a str,
}

fn replica_id(replica: Option<String>) -> Result<String, Problem> {
    match replica {
        Some(r) if !r.is_empty() && r.chars().count() <= MAX_REPLICA_CHARS => Ok(r),
        _ => Err(Problem::bad_request(format!(
            "replica: the gateway replica's id (its Pod name), 1 to {MAX_REPLICA_CHARS} characters"
        ))),
    }
}

impl Discovery {
    /// The gateway's door on the discovery API's router.
    pub(super) fn with_gateway_door(
        router: axum::Router<Arc<Discovery>>,
    ) -> axum::Router<Arc<Discovery>> {
        router
            .route("/v1/gateway/routes", axum::routing::post(route))
            .route(
                "/v1/gateway/replicas/{replica}",
                axum::routing::put(replica_load),
            )
            .route("/v1/gateway/reports", axum::routing::post(report))
            .route(
                "/v1/gateway/session-reports",
                axum::routing::post(session_report),
            )
    }
}

/// `POST /v1/gateway/routes`: the upstream for one client request or tunnel.
async fn route(
    State(discovery): State<Arc<Discovery>>,
    _: FromGateway,
    Authorized(caller): Authorized,
    JsonBody(body): JsonBody<RouteBody>,
) -> Result<Response, Problem> {
    let access = discovery.gateway.as_ref().expect("checked by FromGateway");
    let replica = replica_id(body.replica)?;
    checked_session(body.session.as_deref())?;
    let target = checked_target(body.target)?;
    let pool = body
        .pool
        .as_deref()
        .map(|p| parse_key("pool", "ProxyPool", p))
        .transpose()?;
    let avoid = body
        .avoid
        .as_deref()
        .map(|p| parse_key("avoid", "Proxy", p))
        .transpose()?;
    // Scope first, as for a grant: the table routes only inside what the client may lease.
    let reach = discovery
        .auth
        .authorize_lease(&caller, &Scope::of_grant(pool.as_ref(), None))
        .await
        .map_err(Problem::from_auth)?;
    let filters = LeaseRequest {
        reach,
        provider: body.provider,
        zone: body.zone,
        pool,
        session: body.session,
        target,
        holder: caller.holder().map(str::to_string),
        ..LeaseRequest::default()
    };
    let request = RouteRequest {
        filters,
        replica,
        avoid,
        max_connections: access.max_connections_per_proxy,
    };
    let routed = discovery
        .store
        .route(&request)
        .map_err(|e| Problem::from_grant_error(e, &request.filters))?;
    let (entry, pool) = (&routed.entry, routed.pool.as_deref());
    let answer = RouteAnswer {
        proxy: RoutedProxy {
            namespace: &entry.key.namespace,
            name: &entry.key.name,
            address: &entry.address,
            port: entry.port,
        },
        pool: entry
            .pool
            .as_ref()
            .map(|p| format!("{}/{p}", entry.key.namespace)),
        login: entry.login.as_ref().map(|l| Login {
            username: l.username(),
            password: l.password(),
        }),
        protocol: entry.protocol,
        block_statuses: pool
            .and_then(|p| p.block_statuses.as_deref())
            .unwrap_or(&access.block_statuses),
        block_body_patterns: pool.map_or(&[], |p| &p.block_body_patterns),
    };
    Ok(Json(answer).into_response())
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct LoadBody {
    /// Open upstream connections by `namespace/name`.
    connections: Option<BTreeMap<String, u32>>,
    /// Bytes carried since the replica's previous report, by pool (`namespace/name`, or
    /// `none`).
    bytes: Option<BTreeMap<String, BytesBody>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BytesBody {
    #[serde(default)]
    sent: u64,
    #[serde(default)]
    received: u64,
}

/// A load report's bytes per pool, keys checked.
fn pool_bytes(
    bytes: BTreeMap<String, BytesBody>,
) -> Result<Vec<(Option<ProxyKey>, PoolTraffic)>, Problem> {
    if bytes.len() > MAX_LOAD_ENTRIES {
        return Err(Problem::bad_request(format!(
            "bytes: {} pools named; at most {MAX_LOAD_ENTRIES}",
            bytes.len()
        )));
    }
    let mut checked = Vec::with_capacity(bytes.len());
    for (pool, b) in bytes {
        let key = match pool.as_str() {
            NO_POOL => None,
            _ => Some(parse_key(&format!("bytes.{pool}"), "ProxyPool", &pool)?),
        };
        let traffic = PoolTraffic {
            sent: b.sent,
            received: b.received,
        };
        checked.push((key, traffic));
    }
    Ok(checked)
}

/// `PUT /v1/gateway/replicas/{replica}`: one replica's open upstream connections.
async fn replica_load(
    State(discovery): State<Arc<Discovery>>,
    _: FromGateway,
    Path(replica): Path<String>,
    JsonBody(body): JsonBody<LoadBody>,
) -> Result<StatusCode, Problem> {
    let replica = replica_id(Some(replica))?;
    let bytes = pool_bytes(body.bytes.unwrap_or_default())?;
    let connections = body.connections.unwrap_or_default();
    if connections.len() > MAX_LOAD_ENTRIES {
        return Err(Problem::bad_request(format!(
            "connections: {} proxies named; at most {MAX_LOAD_ENTRIES}",
            connections.len()
        )));
    }
    let mut load = Vec::with_capacity(connections.len());
    for (key, count) in connections {
        load.push((
            parse_key(&format!("connections.{key}"), "Proxy", &key)?,
            count,
        ));
    }
    discovery
        .store
        .report_replica_load(&replica, load)
        .map_err(|ReplicaError::TooManyReplicas| {
            Problem::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too-many-gateway-replicas",
                "Too many gateway replicas",
                format!(
                    "the leader keeps the loads of at most {} replicas; a silent one is forgotten after {} s",
                    crate::leasing::leases::store::shared::MAX_REPLICAS,
                    crate::leasing::leases::store::shared::REPLICA_SILENCE.as_secs()
                ),
            )
        })?;
    discovery.store.add_gateway_bytes(bytes);
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct SharedReportBody {
    proxy: Option<String>,
    outcome: Option<Outcome>,
    target: Option<String>,
}

/// `POST /v1/gateway/reports`: what the gateway saw on a proxy it routed to.
async fn report(
    State(discovery): State<Arc<Discovery>>,
    _: FromGateway,
    JsonBody(body): JsonBody<SharedReportBody>,
) -> Result<StatusCode, Problem> {
    let proxy: ProxyKey = match body.proxy.as_deref() {
        Some(p) => parse_key("proxy", "Proxy", p)?,
        None => {
            return Err(Problem::bad_request(
                "proxy: missing; namespace/name".into(),
            ));
        }
    };
    let outcome = required_outcome(body.outcome)?;
    let target = checked_target(body.target)?;
    let filters = LeaseRequest {
        proxy: Some(proxy.clone()),
        ..LeaseRequest::default()
    };
    discovery
        .store
        .report_shared(&proxy, outcome, target.as_deref())
        .map_err(|e| Problem::from_grant_error(e, &filters))?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SessionReportBody {
    session: Option<String>,
    outcome: Option<Outcome>,
    target: Option<String>,
}

/// `POST /v1/gateway/session-reports`: a gateway client's own report, on the proxy its
/// session is on. The session is the caller's (sessions are per holder), so a client reports
/// only on proxies it was routed to.
async fn session_report(
    State(discovery): State<Arc<Discovery>>,
    _: FromGateway,
    Authorized(caller): Authorized,
    JsonBody(body): JsonBody<SessionReportBody>,
) -> Result<Response, Problem> {
    let Some(session) = body.session else {
        return Err(Problem::bad_request(
            "session: missing; a report lands on the session's proxy".into(),
        ));
    };
    checked_session(Some(&session))?;
    let outcome = required_outcome(body.outcome)?;
    let target = checked_target(body.target)?;
    let landed = discovery
        .store
        .report_session(caller.holder(), &session, outcome, target.as_deref())
        .map_err(|e| Problem::from_grant_error(e, &LeaseRequest::default()))?;
    let Some(proxy) = landed else {
        return Err(Problem::new(
            StatusCode::NOT_FOUND,
            "session-not-found",
            "The session is on no proxy",
            format!(
                "session `{session}` has no proxy now (never routed, or expired): nothing to report on"
            ),
        ));
    };
    let body = serde_json::json!({
        "proxy": proxy.to_string(),
        "outcome": outcome.as_str(),
    });
    Ok(Json(body).into_response())
}

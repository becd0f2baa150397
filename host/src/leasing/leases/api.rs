//! The discovery HTTP API (see docs/discovery-api.md and the OpenAPI document it serves).
//! Every error is `application/problem+json` (RFC 9457) with a stable `type`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;

use crate::support::leader::LeaderView;

use super::auth::{Auth, AuthError, Caller, Scope};
use super::store::{
    EndReason, GrantError, Lease, LeaseError, LeaseRequest, LeaseStore, NotStored, Outcome,
    ProvisionedProxy, ProxyKey, Reach, normalize_target, validate_session,
};

/// Largest request body accepted; a lease request is a few hundred bytes.
pub const MAX_BODY_BYTES: usize = 16 * 1024;
/// Most header fields a request may carry; more is a `headers-too-large` problem. A crawler
/// sends a handful.
pub const MAX_HEADERS: usize = 100;
/// Header fields the HTTP layer (hyper) parses before it refuses a request itself, with an empty
/// 431 that is no problem document: well above [`MAX_HEADERS`], so the refusal is ours. (hyper's
/// default is 100, which made every request over it an empty 431.) Each parse reserves room for
/// this many fields (64 bytes each), so it stays small.
pub(in crate::leasing::leases) const TRANSPORT_MAX_HEADERS: usize = 1024;
/// The OpenAPI document of this API, committed under docs/.
pub const OPENAPI: &str = include_str!("../../../../docs/discovery-api.openapi.json");

mod gateway;
mod gateway_access;
mod problem_response;
mod problems;
mod wire;

pub use gateway_access::{GATEWAY_TOKEN_HEADER, GatewayAccess};
pub use wire::{GrantBody, ReportBody};
use wire::{Granted, RenewBody, proxy_url, rfc3339};

/// An RFC 9457 problem. `kind` is the last part of its stable `type` URI (answered as
/// `application/problem+json` by `api/problem_response.rs`).
#[derive(Debug)]
pub struct Problem {
    status: StatusCode,
    kind: &'static str,
    title: &'static str,
    detail: String,
    retry_after: Option<Duration>,
    /// `not-leader`: the replica that serves leases.
    leader: Option<String>,
}

/// A JSON body read with a size limit; an empty body is the type's default. Errors name the field.
struct JsonBody<T>(T);

impl<S: Send + Sync, T: DeserializeOwned + Default> FromRequest<S> for JsonBody<T> {
    type Rejection = Problem;

    async fn from_request(req: Request, _: &S) -> Result<Self, Problem> {
        let too_large = || {
            Problem::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "The request body is too large",
                format!("request bodies are limited to {MAX_BODY_BYTES} bytes"),
            )
        };
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        if declared.is_some_and(|n| n > MAX_BODY_BYTES) {
            return Err(too_large());
        }
        let bytes = axum::body::to_bytes(req.into_body(), MAX_BODY_BYTES)
            .await
            .map_err(|_| too_large())?;
        let Some(&first) = bytes.iter().find(|b| !b.is_ascii_whitespace()) else {
            return Ok(JsonBody(T::default()));
        };
        // serde reads a struct from a JSON array too (its fields by position): `[]` would be
        // an empty body. The document's bodies are objects.
        if first != b'{' {
            return Err(match serde_json::from_slice::<serde_json::Value>(&bytes) {
                Err(syntax) => Problem::bad_request(format!("body: not JSON: {syntax}")),
                Ok(_) => Problem::bad_request("body: must be a JSON object".into()),
            });
        }
        // One pass straight into the type. Only a failure is looked at again: for the path of
        // the field that was wrong (serde_path_to_error copies every key it passes, so it is
        // not on the way of a good request), and whether the body was JSON or an object at all.
        if let Ok(value) = serde_json::from_slice(&bytes) {
            return Ok(JsonBody(value));
        }
        let mut deserializer = serde_json::Deserializer::from_slice(&bytes);
        let field_error = match serde_path_to_error::deserialize::<_, T>(&mut deserializer) {
            Ok(_) => None,
            Err(e) => Some(match e.path().to_string() {
                root if root == "." => format!("body: {}", e.inner()),
                path => format!("{path}: {}", e.inner()),
            }),
        };
        Err(match serde_json::from_slice::<serde_json::Value>(&bytes) {
            Err(syntax) => Problem::bad_request(format!("body: not JSON: {syntax}")),
            Ok(v) if !v.is_object() => Problem::bad_request("body: must be a JSON object".into()),
            Ok(_) => Problem::bad_request(field_error.unwrap_or_else(|| "body: not valid".into())),
        })
    }
}

/// What the API needs: the store and who may call it.
pub struct Discovery {
    pub store: Arc<LeaseStore>,
    pub auth: Auth,
    /// With `Some(deadline)`, a grant is answered only once the table holding it is stored.
    stored_within: Option<Duration>,
    /// With leader election: who serves, and this replica's identity.
    leader: Option<(LeaderView, String)>,
    /// The gateway's side door (`/v1/gateway/…`), when enabled.
    gateway: Option<GatewayAccess>,
}

impl Discovery {
    /// `token` must not be empty (checked by the caller, which knows the flag's name). Grants
    /// are answered at once (the table is written behind).
    pub fn new(store: Arc<LeaseStore>, token: &str) -> Self {
        Self::with_auth(store, Auth::none().with_static_token(token, None))
    }

    /// Callers checked by `auth` (the static token, Kubernetes tokens, or both).
    pub fn with_auth(store: Arc<LeaseStore>, auth: Auth) -> Self {
        Discovery {
            store,
            auth,
            stored_within: None,
            leader: None,
            gateway: None,
        }
    }

    /// Whether `id` is a lease (live or ended) granted to somebody other than `caller`:
    /// only its holder may use it, and to anyone else it is answered as an id never granted
    /// (`lease-not-found`; a release: `204`), so a lease id tells nobody else anything.
    fn someone_elses(&self, caller: &Caller, id: &str) -> bool {
        self.store
            .holder(id)
            .is_some_and(|holder| !Auth::holds(caller, holder.as_deref()))
    }

    /// [`Self::someone_elses`] as the answer of a lease that does not exist.
    fn check_holder(&self, caller: &Caller, id: &str) -> Result<(), Problem> {
        match self.someone_elses(caller, id) {
            true => Err(Problem::from_lease_error(LeaseError::NotFound, id)),
            false => Ok(()),
        }
    }

    /// A standby answers every authorized request with a `not-leader` problem naming the leader
    /// (from `view`), never a grant.
    pub fn naming_the_leader(mut self, view: LeaderView, identity: &str) -> Self {
        self.leader = Some((view, identity.to_string()));
        self
    }

    /// The answer of a replica that does not serve: `None` on the one that does, and where the
    /// leader is unknown or is this replica (starting or stepping down), the store's own
    /// `not-ready` follows.
    fn standby_answer(&self) -> Option<Problem> {
        let (view, identity) = self.leader.as_ref()?;
        if view.is_serving() {
            return None;
        }
        match view.last_seen() {
            Some((Some(holder), _)) if &holder != identity => Some(Problem::not_leader(&holder)),
            _ => None,
        }
    }

    /// Serves the gateway's routes, loads and reports to callers with `access.token`.
    pub fn serving_the_gateway(mut self, access: GatewayAccess) -> Self {
        self.gateway = Some(access);
        self
    }

    /// Answers a grant only once it is stored, refusing it when that takes longer than
    /// `deadline` (`--lease-durability sync`).
    pub fn answer_grants_once_stored(mut self, deadline: Duration) -> Self {
        self.stored_within = Some(deadline);
        self
    }
}

/// The discovery API's routes. Everything but the OpenAPI document needs the token, including
/// the answers for unknown paths and methods.
pub fn router(discovery: Arc<Discovery>) -> Router {
    Discovery::with_gateway_door(Router::new())
        .route("/openapi.json", get(openapi))
        .route("/v1/leases", post(grant))
        .route("/v1/leases/{id}", get(show).delete(release))
        .route("/v1/leases/{id}/report", post(report))
        .route("/v1/leases/{id}/renew", post(renew))
        .route("/v1/proxies", get(proxies))
        .fallback(|_: Authorized| async {
            Problem::new(
                StatusCode::NOT_FOUND,
                "not-found",
                "No such endpoint",
                "see /openapi.json for the endpoints".into(),
            )
        })
        .method_not_allowed_fallback(|_: Authorized| async {
            Problem::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
                "see /openapi.json for the methods of each endpoint".into(),
            )
        })
        .with_state(discovery)
}

/// Who called, checked: the static token, or a Kubernetes token the API server accepted. An
/// extractor rather than a middleware layer: it runs before the body is read, and costs no
/// boxed service per request (the grant path is benchmarked against a bare handler).
struct Authorized(Caller);

impl FromRequestParts<Arc<Discovery>> for Authorized {
    type Rejection = Problem;

    async fn from_request_parts(
        parts: &mut Parts,
        discovery: &Arc<Discovery>,
    ) -> Result<Self, Problem> {
        // The scheme name is case-insensitive (RFC 9110 §11.1).
        let bearer = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token);
        let caller = discovery
            .auth
            .authenticate(bearer)
            .await
            .map_err(Problem::from_auth)?;
        match discovery.standby_answer() {
            Some(problem) => Err(problem),
            None => Ok(Authorized(caller)),
        }
    }
}

/// The `{id}` of a lease path: 32 lowercase hex characters, as grants make them. Any other id
/// (one that does not decode to UTF-8, `%ff`, included) is a `bad-request` problem naming `id`,
/// as the OpenAPI document's pattern says; a well-formed id that is no lease is released
/// idempotently (204) or not found (404).
struct LeaseId(String);

/// Whether `id` has the shape of a lease id (`^[0-9a-f]{32}$`).
fn is_lease_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl<S: Send + Sync> FromRequestParts<S> for LeaseId {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        let not_an_id = |shown: &str, why: &str| {
            Problem::bad_request(format!(
                "id: `{}` is not a lease id (32 lowercase hex characters, as POST /v1/leases \
                 returns it){why}",
                shown.escape_debug()
            ))
        };
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(id)) if is_lease_id(&id) => Ok(LeaseId(id)),
            Ok(Path(id)) => {
                let shown: String = id.chars().take(64).collect();
                Err(not_an_id(&shown, ""))
            }
            Err(rejection) => {
                // Only the raw path is left to show: the id did not decode.
                let raw = parts.uri.path().trim_start_matches("/v1/leases/");
                let raw: String = raw
                    .split('/')
                    .next()
                    .unwrap_or_default()
                    .chars()
                    .take(64)
                    .collect();
                Err(not_an_id(&raw, &format!(": {}", rejection.body_text())))
            }
        }
    }
}

/// `namespace/name` of a `kind` in `field`.
fn parse_key(field: &str, kind: &str, value: &str) -> Result<ProxyKey, Problem> {
    ProxyKey::parse(value).ok_or_else(|| {
        Problem::bad_request(format!(
            "{field}: `{value}` must be `namespace/name` of a {kind}"
        ))
    })
}

/// A `target` field, normalized (see [`normalize_target`]); the problem names the field.
fn checked_target(target: Option<String>) -> Result<Option<String>, Problem> {
    target
        .map(normalize_target)
        .transpose()
        .map_err(|e| Problem::bad_request(format!("target: {e}")))
}

/// A `session` field, checked (see [`validate_session`]).
fn checked_session(session: Option<&str>) -> Result<(), Problem> {
    let invalid = |e| Problem::bad_request(format!("session: {e}"));
    session.map_or(Ok(()), |s| validate_session(s).map_err(invalid))
}

/// A report's `outcome`, which is required.
fn required_outcome(outcome: Option<Outcome>) -> Result<Outcome, Problem> {
    outcome.ok_or_else(|| {
        Problem::bad_request("outcome: missing; one of success, failure, blocked".into())
    })
}

/// The request a grant body asks for, every field checked.
fn lease_request(body: GrantBody) -> Result<LeaseRequest, Problem> {
    if body.ttl_seconds == Some(0) {
        return Err(Problem::bad_request(
            "ttlSeconds: must be at least 1 (omit it for the default)".into(),
        ));
    }
    checked_session(body.session.as_deref())?;
    let target = checked_target(body.target)?;
    Ok(LeaseRequest {
        provider: body.provider,
        zone: body.zone,
        selector: body.selector.unwrap_or_default(),
        proxy: body
            .proxy
            .as_deref()
            .map(|p| parse_key("proxy", "Proxy", p))
            .transpose()?,
        pool: body
            .pool
            .as_deref()
            .map(|p| parse_key("pool", "ProxyPool", p))
            .transpose()?,
        session: body.session,
        target,
        ttl: body.ttl_seconds.map(Duration::from_secs),
        holder: None,
        // Set from the caller's authorization before the table is asked.
        reach: Reach::Nowhere,
    })
}

/// With `--lease-durability sync`: waits until the table holding the latest change is stored.
async fn confirm_stored(discovery: &Discovery) -> Result<(), Problem> {
    let Some(deadline) = discovery.stored_within else {
        return Ok(());
    };
    let version = discovery.store.version();
    discovery
        .store
        .wait_stored(version, deadline)
        .await
        .map_err(|e| match e {
            NotStored::Closed => Problem::not_ready(),
            NotStored::TimedOut => Problem::not_stored(deadline),
        })
}

fn lease_response(status: StatusCode, lease: Lease, entry: &ProvisionedProxy) -> Response {
    let location = format!("/v1/leases/{}", lease.id);
    (
        status,
        [(header::LOCATION, location)],
        Json(Granted::new(lease, entry)),
    )
        .into_response()
}

async fn grant(
    State(discovery): State<Arc<Discovery>>,
    Authorized(caller): Authorized,
    JsonBody(body): JsonBody<GrantBody>,
) -> Result<Response, Problem> {
    let mut request = lease_request(body)?;
    // Scope first: what the caller may lease from, for everything the request names; only
    // then is the table asked, and only inside that.
    request.reach = discovery
        .auth
        .authorize_lease(
            &caller,
            &Scope::of_grant(request.pool.as_ref(), request.proxy.as_ref()),
        )
        .await
        .map_err(Problem::from_auth)?;
    request.holder = caller.holder().map(str::to_string);
    let grant = discovery
        .store
        .grant_or_join(&request)
        .map_err(|e| Problem::from_grant_error(e, &request))?;
    if grant.joined {
        // The session's own lease again: nothing new to store.
        return Ok(lease_response(StatusCode::OK, grant.lease, &grant.entry));
    }
    if let Err(problem) = confirm_stored(&discovery).await {
        // Unanswered, the lease must not hold the proxy; if a later write stores it anyway,
        // the release is stored after it.
        let _ = discovery.store.release(&grant.lease.id);
        return Err(problem);
    }
    Ok(lease_response(
        StatusCode::CREATED,
        grant.lease,
        &grant.entry,
    ))
}

async fn show(
    State(discovery): State<Arc<Discovery>>,
    Authorized(caller): Authorized,
    LeaseId(id): LeaseId,
) -> Result<Response, Problem> {
    discovery.check_holder(&caller, &id)?;
    let (lease, entry) = discovery
        .store
        .lease(&id)
        .map_err(|e| Problem::from_lease_error(e, &id))?;
    Ok(Json(Granted::new(lease, &entry)).into_response())
}

async fn renew(
    State(discovery): State<Arc<Discovery>>,
    Authorized(caller): Authorized,
    LeaseId(id): LeaseId,
    JsonBody(body): JsonBody<RenewBody>,
) -> Result<Response, Problem> {
    discovery.check_holder(&caller, &id)?;
    if body.ttl_seconds == Some(0) {
        return Err(Problem::bad_request(
            "ttlSeconds: must be at least 1 (omit it for the lease's own lifetime)".into(),
        ));
    }
    let (lease, entry) = discovery
        .store
        .renew(&id, body.ttl_seconds.map(Duration::from_secs))
        .map_err(|e| Problem::from_lease_error(e, &id))?;
    // Unstored, a renewal may be forgotten by a failover: the lease then ends at its old expiry,
    // which the crawler must be told.
    confirm_stored(&discovery).await?;
    Ok(Json(Granted::new(lease, &entry)).into_response())
}

async fn report(
    State(discovery): State<Arc<Discovery>>,
    Authorized(caller): Authorized,
    LeaseId(id): LeaseId,
    JsonBody(body): JsonBody<ReportBody>,
) -> Result<Response, Problem> {
    discovery.check_holder(&caller, &id)?;
    let outcome = required_outcome(body.outcome)?;
    let target = checked_target(body.target)?;
    let lease = discovery
        .store
        .report_for(&id, outcome, target.as_deref())
        .map_err(|e| Problem::from_lease_error(e, &id))?;
    let active = outcome != Outcome::Blocked;
    let mut body = serde_json::json!({
        "id": lease.id,
        "outcome": outcome.as_str(),
        "active": active,
    });
    if active {
        body["expiresAt"] = rfc3339(lease.expires_at_ms).into();
    }
    Ok(Json(body).into_response())
}

async fn release(
    State(discovery): State<Arc<Discovery>>,
    Authorized(caller): Authorized,
    LeaseId(id): LeaseId,
) -> Result<StatusCode, Problem> {
    if discovery.someone_elses(&caller, &id) {
        // As for an id never granted: nothing of the caller's to release.
        return Ok(StatusCode::NO_CONTENT);
    }
    discovery
        .store
        .release(&id)
        .map_err(|e| Problem::from_lease_error(e, &id))?;
    Ok(StatusCode::NO_CONTENT)
}

async fn proxies(
    State(discovery): State<Arc<Discovery>>,
    Authorized(caller): Authorized,
) -> Result<Response, Problem> {
    discovery
        .auth
        .authorize_list(&caller)
        .await
        .map_err(Problem::from_auth)?;
    let views = discovery
        .store
        .proxies()
        .map_err(|e| Problem::from_lease_error(e, ""))?;
    let items: Vec<serde_json::Value> = views
        .into_iter()
        .map(|v| {
            let mut item = serde_json::json!({
                "namespace": v.namespace,
                "name": v.name,
                "provider": v.provider,
                "address": v.address,
                "port": v.port,
                "proxyUrl": proxy_url(v.protocol, &v.address, v.port),
                "state": v.state,
            });
            if let Some(zone) = v.zone {
                item["zone"] = zone.into();
            }
            if let Some(ip) = v.exit_ip {
                item["exitIP"] = ip.into();
            }
            if let Some(ms) = v.cooldown_until_ms {
                item["cooldownUntil"] = rfc3339(ms).into();
            }
            if let Some(ms) = v.lease_expires_at_ms {
                item["leaseExpiresAt"] = rfc3339(ms).into();
            }
            if let Some(pool) = v.pool {
                item["pool"] = pool.into();
            }
            if v.draining {
                item["draining"] = true.into();
            }
            if let Some(connections) = v.gateway_connections {
                item["gatewayConnections"] = connections.into();
            }
            item
        })
        .collect();
    Ok(Json(serde_json::json!({ "proxies": items })).into_response())
}

async fn openapi() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        OPENAPI,
    )
        .into_response()
}

//! The problems the discovery API answers with, one constructor each: the status, the stable
//! type, and a detail that says what to do.

use super::*;

impl Problem {
    pub(super) fn new(
        status: StatusCode,
        kind: &'static str,
        title: &'static str,
        detail: String,
    ) -> Self {
        Problem {
            status,
            kind,
            title,
            detail,
            retry_after: None,
            leader: None,
        }
    }

    pub(super) fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    pub(super) fn bad_request(detail: String) -> Self {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "bad-request",
            "The request is not valid",
            detail,
        )
    }

    pub(in crate::leasing::leases) fn headers_too_large(count: usize) -> Self {
        Problem::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers-too-large",
            "Too many header fields",
            format!("the request has {count} header fields; at most {MAX_HEADERS} are accepted"),
        )
    }

    pub(super) fn not_ready() -> Self {
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not-ready",
            "This replica is not serving leases",
            "the operator is starting or is not the leader; retry".into(),
        )
        .retry_after(Duration::from_secs(5))
    }

    /// A standby was asked: it names the replica that serves leases (`leader`, an extension
    /// member) so a crawler that reached it directly can tell what happened.
    pub(super) fn not_leader(leader: &str) -> Self {
        let mut problem = Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not-leader",
            "This replica is a standby",
            format!(
                "leases are served by the leader, {leader}; the discovery Service routes to it (retry through the Service)"
            ),
        )
        .retry_after(Duration::from_secs(1));
        problem.leader = Some(leader.to_string());
        problem
    }

    pub(super) fn from_auth(error: AuthError) -> Self {
        match error {
            AuthError::Unauthenticated(detail) => Problem::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "Missing or wrong bearer token",
                detail,
            ),
            AuthError::Forbidden(detail) => Problem::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "The caller may not do this",
                detail,
            ),
            AuthError::Unavailable(detail) => Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "auth-unavailable",
                "The caller cannot be checked now",
                detail,
            )
            .retry_after(Duration::from_secs(5)),
        }
    }

    pub(super) fn not_stored(deadline: Duration) -> Self {
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "lease-not-stored",
            "The lease table cannot be stored",
            format!(
                "the lease could not be written to the cluster within {} s, so it was not granted (the API server is unreachable or slow); leases already granted stay valid; retry",
                deadline.as_secs()
            ),
        )
        .retry_after(Duration::from_secs(5))
    }

    pub(super) fn from_lease_error(error: LeaseError, id: &str) -> Self {
        match error {
            LeaseError::NotFound => Problem::new(
                StatusCode::NOT_FOUND,
                "lease-not-found",
                "No such lease",
                format!("lease {id} does not exist; request a new one with POST /v1/leases"),
            ),
            LeaseError::Ended(reason) => Problem::new(
                StatusCode::GONE,
                "lease-ended",
                "The lease has ended",
                format!(
                    "lease {id} ended ({}); request a new one with POST /v1/leases",
                    match reason {
                        EndReason::Released => "released",
                        EndReason::Expired => "expired",
                        EndReason::Blocked => "the proxy was reported blocked and cools down",
                        EndReason::Unhealthy => "the proxy failed its health probes",
                        EndReason::Deleted => "the proxy was deleted",
                    }
                ),
            ),
            LeaseError::Draining => Problem::draining(),
            LeaseError::NotReady => Problem::not_ready(),
        }
    }

    /// A draining proxy (its pool is removing it): no new lease, session or renewal on it.
    pub(super) fn draining() -> Self {
        Problem::new(
            StatusCode::CONFLICT,
            "proxy-draining",
            "The proxy is being removed",
            "its pool is removing it: it gets no new lease and no renewal; request a new lease \
             without `proxy` (leases on it run until they end)"
                .into(),
        )
    }

    pub(super) fn from_grant_error(error: GrantError, request: &LeaseRequest) -> Self {
        match error {
            GrantError::NoProxy { retry_after } => Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "no-proxy-available",
                "No proxy available",
                "every matching proxy is leased, cooling down or unhealthy".into(),
            )
            .retry_after(retry_after),
            GrantError::NoMatch => Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "no-matching-proxy",
                "No proxy matches the request",
                "no provisioned proxy, in any state, has this provider, zone, pool and labels; \
                 retrying will not help until such a proxy is provisioned (compare with GET \
                 /v1/proxies)"
                    .into(),
            ),
            GrantError::UnknownPool => Problem::new(
                StatusCode::NOT_FOUND,
                "unknown-pool",
                "No such pool",
                format!(
                    "pool {}: no ProxyPool of that namespace/name",
                    request
                        .pool
                        .as_ref()
                        .map(|k| k.to_string())
                        .unwrap_or_default()
                ),
            ),
            GrantError::CoolingDown { retry_after } => Problem::new(
                StatusCode::CONFLICT,
                "proxy-cooling-down",
                "The proxy is cooling down",
                format!(
                    "it was reported blocked{}; it can be leased again in {} s",
                    if request.target.is_some() {
                        " (for this target)"
                    } else {
                        ""
                    },
                    retry_after.as_secs()
                ),
            )
            .retry_after(retry_after),
            GrantError::Leased { retry_after } => Problem::new(
                StatusCode::CONFLICT,
                "proxy-leased",
                "The proxy is leased",
                "another crawler holds it".into(),
            )
            .retry_after(retry_after),
            GrantError::Draining => Problem::draining(),
            GrantError::UnknownProxy => Problem::new(
                StatusCode::NOT_FOUND,
                "proxy-not-found",
                "No such proxy",
                format!(
                    "proxy {}: no provisioned Proxy of that namespace/name that this caller may lease from (in the pool it names, else in the proxy's namespace)",
                    request
                        .proxy
                        .as_ref()
                        .map(|k| k.to_string())
                        .unwrap_or_default()
                ),
            ),
            GrantError::NotReady => Problem::not_ready(),
            GrantError::QuotaExceeded(detail) => Problem::quota_exceeded(detail),
        }
    }

    /// A ProxyQuota bound of the proxy's namespace is reached: 429, with what to do.
    pub(super) fn quota_exceeded(detail: String) -> Self {
        Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            "quota-exceeded",
            "The namespace's quota is used up",
            format!("{detail}; release a lease (or close a connection) first, or ask the platform team to raise the quota"),
        )
        .retry_after(Duration::from_secs(5))
    }
}

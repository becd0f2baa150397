//! Who may lease what (docs/security.md, "Who may lease what"). A bearer token is either the
//! static token of the discovery Secret, or a Kubernetes token (a ServiceAccount's) that the API
//! server reviews (TokenReview); leasing from a pool is then RBAC's decision, asked with a
//! SubjectAccessReview of `create` on `proxypools/lease`. Reviews are cached briefly, keyed by a
//! digest of the token (never the token), in bounded memory; a review that cannot be made is a
//! 503, never an allow.

mod cache;
mod kube_reviewer;
mod review;
pub mod team;
pub mod team_watch;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use cache::BoundedCache;

use super::store::Reach;

pub use kube_reviewer::KubeReviewer;
pub use review::{Access, POOL_GROUP, Review, ReviewError, Reviewer, Scope, User};
pub use team::{CredentialBook, TeamCredential};

/// Longest bearer token sent for review: a ServiceAccount token is about 1 KiB.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// SHA-256 of a bearer token: what the caches key on, so no token is kept in memory.
pub type TokenDigest = [u8; 32];

/// Who called the discovery API.
#[derive(Clone, Debug)]
pub enum Caller {
    /// The static token of the discovery Secret.
    StaticToken,
    /// A Kubernetes user (a ServiceAccount), and the digest of the token it presented.
    Kubernetes { user: Arc<User>, token: TokenDigest },
    /// A team's gateway credential (a labelled Secret in its namespace, docs/gateway.md).
    Credential(Arc<TeamCredential>),
}

impl Caller {
    /// What a lease granted to this caller records as its holder: the username, or nothing for
    /// the static token (as every lease before holders were recorded).
    pub fn holder(&self) -> Option<&str> {
        match self {
            Caller::StaticToken => None,
            Caller::Kubernetes { user, .. } => Some(&user.username),
            Caller::Credential(credential) => Some(&credential.holder),
        }
    }
}

/// The pools the static token may lease from (`--discovery-token-pools`): `namespace/name`, or
/// `namespace/*` for every pool of a namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenPools(Vec<(String, Option<String>)>);

impl std::str::FromStr for TokenPools {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, String> {
        let mut pools = Vec::new();
        for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            match item.split_once('/') {
                Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                    if ns == "*" {
                        return Err(format!(
                            "`{item}`: the namespace cannot be `*`; leave the list unset for every pool"
                        ));
                    }
                    pools.push((ns.to_string(), (name != "*").then(|| name.to_string())));
                }
                _ => {
                    return Err(format!(
                        "`{item}` is not `namespace/name` or `namespace/*` (e.g. crawlers/pool-a,team-b/*)"
                    ));
                }
            }
        }
        if pools.is_empty() {
            return Err("no pool listed; leave it unset for every pool".into());
        }
        Ok(TokenPools(pools))
    }
}

impl std::fmt::Display for TokenPools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (ns, name)) in self.0.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            write!(f, "{sep}{ns}/{}", name.as_deref().unwrap_or("*"))?;
        }
        Ok(())
    }
}

impl TokenPools {
    /// A named pool must be listed (or its namespace with `*`); a namespace-wide grant needs
    /// `namespace/*`; a cluster-wide one is never allowed to a limited token.
    pub fn allows(&self, scope: &Scope) -> bool {
        self.0.iter().any(|(ns, name)| match scope {
            Scope::Pool(pool) => {
                **ns == *pool.namespace && name.as_ref().is_none_or(|n| **n == *pool.name)
            }
            Scope::Namespace(namespace) => ns == namespace && name.is_none(),
            Scope::Cluster => false,
        })
    }
}

/// How Kubernetes callers are checked.
#[derive(Clone, Debug)]
pub struct KubeAuthOptions {
    /// How long an authenticated token and an allowed decision are reused.
    pub allow_ttl: Duration,
    /// How long a refused token or a denied decision is reused.
    pub deny_ttl: Duration,
    /// Deadline of one review, waiting for a review slot included.
    pub timeout: Duration,
    /// Entries each cache holds at most (tokens; token and pool pairs).
    pub cache_capacity: usize,
    /// Reviews in flight at once; more wait (within `timeout`).
    pub concurrent_reviews: usize,
    /// The audience a token must be for (empty: the API server's own).
    pub audience: String,
    /// Review only what can be a ServiceAccount token (a JWT): anything else is refused without
    /// asking the API server. Off where users' own tokens are accepted too (the metrics port:
    /// a static or an identity provider's token need not be a JWT).
    pub jwt_only: bool,
}

impl Default for KubeAuthOptions {
    fn default() -> Self {
        KubeAuthOptions {
            allow_ttl: Duration::from_secs(20),
            deny_ttl: Duration::from_secs(3),
            timeout: Duration::from_secs(3),
            cache_capacity: 10_000,
            concurrent_reviews: 32,
            audience: "proxy-operator".into(),
            jwt_only: true,
        }
    }
}

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    /// No token, a wrong one, or one the API server does not accept (401); the detail says
    /// what to send.
    Unauthenticated(String),
    /// Authenticated, but not allowed (403); the detail says which right is missing.
    Forbidden(String),
    /// The caller could not be checked now (503); the detail says why.
    Unavailable(String),
}

struct KubeAuth {
    reviewer: Arc<dyn Reviewer>,
    options: KubeAuthOptions,
    identities: BoundedCache<TokenDigest, Option<Arc<User>>>,
    decisions: BoundedCache<(TokenDigest, Access), bool>,
    slots: tokio::sync::Semaphore,
}

/// The discovery API's authentication and authorization.
pub struct Auth {
    static_token: Option<TokenDigest>,
    static_pools: Option<TokenPools>,
    kube: Option<KubeAuth>,
    credentials: Option<Arc<CredentialBook>>,
}

impl Auth {
    /// Accepts nobody; add the static token and/or Kubernetes tokens.
    pub fn none() -> Auth {
        Auth {
            static_token: None,
            static_pools: None,
            kube: None,
            credentials: None,
        }
    }

    /// The static token, for every pool (`pools: None`) or for those listed.
    pub fn with_static_token(mut self, token: &str, pools: Option<TokenPools>) -> Auth {
        self.static_token = Some(Sha256::digest(token.trim().as_bytes()).into());
        self.static_pools = pools;
        self
    }

    /// Kubernetes tokens, reviewed by `reviewer`.
    pub fn with_kubernetes(
        mut self,
        reviewer: Arc<dyn Reviewer>,
        options: KubeAuthOptions,
    ) -> Auth {
        self.kube = Some(KubeAuth {
            reviewer,
            identities: BoundedCache::new(options.cache_capacity),
            decisions: BoundedCache::new(options.cache_capacity),
            slots: tokio::sync::Semaphore::new(options.concurrent_reviews.max(1)),
            options,
        });
        self
    }

    /// Teams' gateway credentials, as `book` (filled by [`team_watch::watch`]) has them.
    pub fn with_credentials(mut self, book: Arc<CredentialBook>) -> Auth {
        self.credentials = Some(book);
        self
    }

    /// Whether any token is accepted at all.
    pub fn accepts_anyone(&self) -> bool {
        self.static_token.is_some() || self.kube.is_some() || self.credentials.is_some()
    }

    /// Entries in the two caches (tokens; decisions), for tests and bounds.
    pub fn cached(&self) -> (usize, usize) {
        self.kube
            .as_ref()
            .map_or((0, 0), |k| (k.identities.len(), k.decisions.len()))
    }

    fn unauthenticated(&self) -> AuthError {
        let what = self.what_to_send();
        AuthError::Unauthenticated(match &self.credentials {
            Some(_) => format!(
                "{what}, or a gateway credential of your team (docs/gateway.md, \"Team credentials\")"
            ),
            None => what,
        })
    }

    fn what_to_send(&self) -> String {
        match &self.kube {
            None => "send `Authorization: Bearer <token>` with the token of the discovery Secret"
                .into(),
            Some(k) if k.options.audience.is_empty() => "send `Authorization: Bearer <token>` with the token of the discovery Secret or a ServiceAccount token".into(),
            Some(k) => format!(
                "send `Authorization: Bearer <token>` with the token of the discovery Secret or a ServiceAccount token for the audience `{}` (a projected serviceAccountToken volume)",
                k.options.audience
            ),
        }
    }

    /// Who presented `bearer` (the token after `Bearer `).
    pub async fn authenticate(&self, bearer: Option<&str>) -> Result<Caller, AuthError> {
        let Some(token) = bearer.map(str::trim).filter(|t| !t.is_empty()) else {
            return Err(self.unauthenticated());
        };
        let digest: TokenDigest = Sha256::digest(token.as_bytes()).into();
        // Compare digests: constant time, and the token's length does not leak either.
        if let Some(expected) = &self.static_token
            && bool::from(digest.as_slice().ct_eq(expected.as_slice()))
        {
            return Ok(Caller::StaticToken);
        }
        if let Some(book) = &self.credentials {
            match book.find(&digest) {
                team::Found::One(credential) => return Ok(Caller::Credential(credential)),
                // (Logged once by the watch, not per request.)
                team::Found::Ambiguous(_) => return Err(self.unauthenticated()),
                team::Found::None => {}
            }
        }
        match &self.kube {
            Some(kube) => kube
                .identify(token, digest)
                .await?
                // The holder of a team credential's leases is no Kubernetes user's.
                .filter(|user| !user.username.starts_with(team::HOLDER_PREFIX))
                .map(|user| Caller::Kubernetes {
                    user,
                    token: digest,
                })
                .ok_or_else(|| self.unauthenticated()),
            None => Err(self.unauthenticated()),
        }
    }

    /// Whether `caller` may lease from `scope`; allowed, what the table may then look at for it
    /// (the only way the discovery API makes a [`Reach`]).
    pub async fn authorize_lease(
        &self,
        caller: &Caller,
        scope: &Scope<'_>,
    ) -> Result<Reach, AuthError> {
        if let Caller::Credential(credential) = caller {
            return credential.reach(scope).map_err(AuthError::Forbidden);
        }
        self.allow_lease(caller, scope).await?;
        Ok(scope.reach())
    }

    async fn allow_lease(&self, caller: &Caller, scope: &Scope<'_>) -> Result<(), AuthError> {
        match caller {
            Caller::StaticToken => match &self.static_pools {
                Some(pools) if !pools.allows(scope) => Err(AuthError::Forbidden(format!(
                    "the static token may lease only from the pools {pools} (--discovery-token-pools), not from {scope}; name one of them in `pool`"
                ))),
                _ => Ok(()),
            },
            Caller::Kubernetes { user, token } => {
                self.decide(user, token, Access::lease(scope), || {
                    format!("lease from {scope}")
                })
                .await
            }
            Caller::Credential(credential) => credential
                .reach(scope)
                .map(|_| ())
                .map_err(AuthError::Forbidden),
        }
    }

    /// Whether `caller` may list every proxy (`GET /v1/proxies`).
    pub async fn authorize_list(&self, caller: &Caller) -> Result<(), AuthError> {
        match caller {
            Caller::StaticToken if self.static_pools.is_some() => Err(AuthError::Forbidden(
                "the static token is limited to pools (--discovery-token-pools) and may not list every proxy".into(),
            )),
            Caller::StaticToken => Ok(()),
            Caller::Credential(c) => Err(AuthError::Forbidden(format!(
                "the gateway credential {}/{} is limited to pools of its namespace and may not list every proxy",
                c.namespace, c.secret
            ))),
            Caller::Kubernetes { user, token } => {
                self.decide(user, token, Access::list_proxies(), || {
                    "list every proxy".into()
                })
                .await
            }
        }
    }

    /// Whether `caller` may `get` the non-resource URL `path` (`/metrics`, `/status`): a
    /// Kubernetes user RBAC allows it; the static token never (it is the crawlers').
    pub async fn authorize_path(&self, caller: &Caller, path: &str) -> Result<(), AuthError> {
        match caller {
            Caller::StaticToken => Err(AuthError::Forbidden(format!(
                "the discovery API's static token does not read {path}; send a ServiceAccount token"
            ))),
            Caller::Credential(_) => Err(AuthError::Forbidden(format!(
                "a gateway credential does not read {path}; send a ServiceAccount token"
            ))),
            Caller::Kubernetes { user, token } => {
                self.decide(user, token, Access::non_resource_get(path), || {
                    format!("read {path}")
                })
                .await
            }
        }
    }

    /// Whether `caller` may act on (report on, renew, release, read) a lease granted to
    /// `holder`: only the principal it was granted to. To anyone else the lease is one that
    /// was never granted.
    pub fn holds(caller: &Caller, holder: Option<&str>) -> bool {
        caller.holder() == holder
    }

    /// Allowed, or a denial naming the right `access` (built only then, off the hot path).
    async fn decide(
        &self,
        user: &User,
        token: &TokenDigest,
        access: Access,
        what: impl FnOnce() -> String,
    ) -> Result<(), AuthError> {
        let Some(kube) = &self.kube else {
            return Err(AuthError::Forbidden(
                "Kubernetes tokens are not accepted".into(),
            ));
        };
        match kube.allowed(user, token, access).await? {
            (true, _) => Ok(()),
            (false, access) => {
                let example = match access.path {
                    Some(_) => "e.g. the ClusterRoles of deploy/metrics-rbac.yaml",
                    None => "e.g. deploy/samples/crawler-rbac.yaml",
                };
                Err(AuthError::Forbidden(format!(
                    "{} may not {}: it needs {} ({example})",
                    user.username,
                    what(),
                    access.describe()
                )))
            }
        }
    }
}

impl KubeAuth {
    /// The user behind `token`, reviewed or cached; `None`: not accepted.
    async fn identify(
        &self,
        token: &str,
        digest: TokenDigest,
    ) -> Result<Option<Arc<User>>, AuthError> {
        let now = Instant::now();
        if let Some(known) = self.identities.get(&digest, now) {
            return Ok(known);
        }
        // Only what can be a Kubernetes token costs a review (and a cache entry).
        let reviewable = match self.options.jwt_only {
            true => looks_like_jwt(token),
            false => token.len() <= MAX_TOKEN_BYTES,
        };
        if !reviewable {
            return Ok(None);
        }
        let user = self
            .bounded("TokenReview", self.reviewer.review_token(token))
            .await?
            .map(Arc::new);
        let ttl = match &user {
            Some(_) => allow_ttl(self.options.allow_ttl, jwt_expiry(token), unix_now()),
            None => self.options.deny_ttl,
        };
        self.identities.insert(digest, user.clone(), ttl, now);
        Ok(user)
    }

    /// Whether `user` may do `access`, reviewed or cached; `access` is handed back.
    async fn allowed(
        &self,
        user: &User,
        token: &TokenDigest,
        access: Access,
    ) -> Result<(bool, Access), AuthError> {
        let now = Instant::now();
        let key = (*token, access);
        if let Some(allowed) = self.decisions.get(&key, now) {
            return Ok((allowed, key.1));
        }
        let allowed = self
            .bounded(
                "SubjectAccessReview",
                self.reviewer.review_access(user, &key.1),
            )
            .await?;
        let ttl = if allowed {
            self.options.allow_ttl
        } else {
            self.options.deny_ttl
        };
        self.decisions.insert(key.clone(), allowed, ttl, now);
        Ok((allowed, key.1))
    }

    /// `review` within the deadline and a review slot; a failure is `Unavailable`, never an
    /// answer, and is not cached.
    async fn bounded<T>(&self, what: &str, review: Review<'_, T>) -> Result<T, AuthError> {
        let run = async {
            let _slot = self
                .slots
                .acquire()
                .await
                .expect("the semaphore is never closed");
            review.await
        };
        let error = match tokio::time::timeout(self.options.timeout, run).await {
            Ok(Ok(answer)) => return Ok(answer),
            Ok(Err(e)) => format!("the {what} failed: {e}"),
            Err(_) => format!(
                "the {what} took longer than {} ms",
                self.options.timeout.as_millis()
            ),
        };
        tracing::warn!(error = %error, "cannot check a discovery API caller");
        Err(AuthError::Unavailable(format!(
            "{error}; the operator cannot check Kubernetes tokens now (is the API server reachable?); retry"
        )))
    }
}

/// Whether `token` can be a JWT (three base64url parts): anything else is refused without
/// asking the API server.
pub fn looks_like_jwt(token: &str) -> bool {
    token.len() <= MAX_TOKEN_BYTES
        && token.split('.').count() == 3
        && token.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// The `exp` claim of a JWT (seconds since the epoch), unverified: the API server verified the
/// token; this only keeps a cached identity from outliving it.
pub fn jwt_expiry(token: &str) -> Option<u64> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()?
        .get("exp")?
        .as_u64()
}

/// How long an authenticated token is reused: `ttl`, but never past its expiry.
pub fn allow_ttl(ttl: Duration, expiry: Option<u64>, now_unix: u64) -> Duration {
    match expiry {
        Some(exp) => ttl.min(Duration::from_secs(exp.saturating_sub(now_unix))),
        None => ttl,
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests;

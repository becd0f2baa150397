//! What the API server is asked: who a token is (TokenReview) and whether a user may do
//! something (SubjectAccessReview), as plain values, and the trait that asks.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use crate::leasing::leases::store::{ProxyKey, Reach};

/// The API group of ProxyPools: RBAC grants leasing as `create` on their `lease` subresource.
pub const POOL_GROUP: &str = "proxy-operator.dev";

/// A user the API server authenticated (TokenReview's `status.user`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct User {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// What a grant leases from, which decides the right it needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope<'a> {
    /// `pool`: that ProxyPool.
    Pool(&'a ProxyKey),
    /// `proxy` without `pool`: any pool of the proxy's namespace (a Role without resourceNames).
    Namespace(&'a str),
    /// Neither: any proxy anywhere (a ClusterRole bound cluster-wide).
    Cluster,
}

impl<'a> Scope<'a> {
    /// What a grant (or a gateway route) leases from: its pool when it names one (a proxy it
    /// names must then be of that pool), else the namespace of the proxy it names, else every
    /// pool. What it names beyond that is checked against the [`Reach`] inside the table.
    pub fn of_grant(pool: Option<&'a ProxyKey>, proxy: Option<&'a ProxyKey>) -> Scope<'a> {
        match (pool, proxy) {
            (Some(pool), _) => Scope::Pool(pool),
            (None, Some(proxy)) => Scope::Namespace(&proxy.namespace),
            (None, None) => Scope::Cluster,
        }
    }
}

impl Scope<'_> {
    /// The proxies the table may look at for a request allowed this scope: the same, as a
    /// value the table keeps.
    pub fn reach(&self) -> Reach {
        match self {
            Scope::Pool(pool) => Reach::Pool((*pool).clone()),
            Scope::Namespace(namespace) => Reach::Namespace((*namespace).into()),
            Scope::Cluster => Reach::Everywhere,
        }
    }
}

impl std::fmt::Display for Scope<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scope::Pool(pool) => write!(f, "pool {pool}"),
            Scope::Namespace(namespace) => write!(f, "every pool of namespace {namespace}"),
            Scope::Cluster => write!(f, "every pool of every namespace"),
        }
    }
}

/// The resource attributes of a SubjectAccessReview.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Access {
    pub verb: &'static str,
    pub group: &'static str,
    pub resource: &'static str,
    pub subresource: Option<&'static str>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// A non-resource URL (`/metrics`): then the review asks about it, not about a resource.
    pub path: Option<String>,
}

impl Access {
    /// `create` on `proxypools/lease`: named for a pool, namespace-wide, or cluster-wide.
    pub fn lease(scope: &Scope) -> Access {
        let (namespace, name) = match scope {
            Scope::Pool(pool) => (
                Some(pool.namespace.to_string()),
                Some(pool.name.to_string()),
            ),
            Scope::Namespace(namespace) => (Some(namespace.to_string()), None),
            Scope::Cluster => (None, None),
        };
        Access {
            verb: "create",
            group: POOL_GROUP,
            resource: "proxypools",
            subresource: Some("lease"),
            namespace,
            name,
            path: None,
        }
    }

    /// `GET /v1/proxies` shows every Proxy: the right of `kubectl get proxies -A`.
    pub fn list_proxies() -> Access {
        Access {
            verb: "list",
            group: crate::api::GROUP,
            resource: "proxies",
            subresource: None,
            namespace: None,
            name: None,
            path: None,
        }
    }

    /// `get` on the non-resource URL `path` (`/metrics`, `/status`), as kubebuilder's metrics
    /// authorization asks: a ClusterRole's `nonResourceURLs` grants it.
    pub fn non_resource_get(path: &str) -> Access {
        Access {
            verb: "get",
            group: "",
            resource: "",
            subresource: None,
            namespace: None,
            name: None,
            path: Some(path.to_string()),
        }
    }

    /// As `kubectl auth can-i` spells it, for error details.
    pub(super) fn describe(&self) -> String {
        if let Some(path) = &self.path {
            return format!(
                "{} on the non-resource URL {path} (a ClusterRole with nonResourceURLs, bound by a ClusterRoleBinding)",
                self.verb
            );
        }
        let resource = match self.subresource {
            Some(sub) => format!("{}/{sub}", self.resource),
            None => self.resource.to_string(),
        };
        let name = self
            .name
            .as_ref()
            .map(|n| format!(" (resourceNames: {n})"))
            .unwrap_or_default();
        let place = match &self.namespace {
            Some(ns) => format!("in namespace {ns}"),
            None => "cluster-wide (a ClusterRoleBinding)".to_string(),
        };
        format!("{} on {resource}.{}{name} {place}", self.verb, self.group)
    }
}

/// A review that could not be made (the API server away, RBAC of the operator, a timeout).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ReviewError(pub String);

/// A review in flight.
pub type Review<'a, T> = Pin<Box<dyn Future<Output = Result<T, ReviewError>> + Send + 'a>>;

/// The API server's two reviews, behind a trait so the decisions around them are tested alone.
pub trait Reviewer: Send + Sync {
    /// The user behind `token`; `None` when the API server does not accept it.
    fn review_token<'a>(&'a self, token: &'a str) -> Review<'a, Option<User>>;
    /// Whether `user` may do `access`.
    fn review_access<'a>(&'a self, user: &'a User, access: &'a Access) -> Review<'a, bool>;
}

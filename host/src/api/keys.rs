//! Proxies and ProxyPools by namespace and name: the key every part that indexes them shares
//! (the lease table, the credentials book, the health engine, the fleet cache).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A Proxy, by namespace and name. The names are shared, not copied: the lease table clones keys
/// on every grant and release under its lock, and a copied `String` there was a `malloc` (often
/// on another thread's arena) inside the lock every crawler waits for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(from = "KeyFields", into = "KeyFields")]
pub struct ProxyKey {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

/// [`ProxyKey`]'s serialized form (serde's `rc` feature is not needed for it).
#[derive(Serialize, Deserialize)]
struct KeyFields {
    namespace: String,
    name: String,
}

impl From<KeyFields> for ProxyKey {
    fn from(fields: KeyFields) -> Self {
        ProxyKey {
            namespace: fields.namespace.into(),
            name: fields.name.into(),
        }
    }
}

impl From<ProxyKey> for KeyFields {
    fn from(key: ProxyKey) -> Self {
        KeyFields {
            namespace: key.namespace.to_string(),
            name: key.name.to_string(),
        }
    }
}

/// A ProxyPool, by namespace and name.
pub type PoolKey = ProxyKey;

impl ProxyKey {
    /// The key of a Proxy, a ProxyPool or any namespaced object: its namespace and name.
    pub fn of(object: &impl kube::ResourceExt) -> ProxyKey {
        ProxyKey {
            namespace: object.namespace().unwrap_or_default().into(),
            name: object.name_any().into(),
        }
    }

    /// `namespace/name`, as `Display` writes it.
    pub fn parse(text: &str) -> Option<ProxyKey> {
        match text.split_once('/') {
            Some((namespace, name))
                if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
            {
                Some(ProxyKey {
                    namespace: namespace.into(),
                    name: name.into(),
                })
            }
            _ => None,
        }
    }
}

impl From<(String, String)> for ProxyKey {
    fn from((namespace, name): (String, String)) -> Self {
        ProxyKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for ProxyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

//! The keys of the lease table, shared by its parts.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// A Proxy, by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ProxyKey {
    pub namespace: String,
    pub name: String,
}

/// A ProxyPool, by namespace and name.
pub type PoolKey = ProxyKey;

impl ProxyKey {
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
        ProxyKey { namespace, name }
    }
}

impl std::fmt::Display for ProxyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The table's maps hash with foldhash: several times faster than SipHash on these short keys, and
/// still randomly seeded. Their keys are ids the store made, Proxies from the cluster and digests.
pub(crate) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

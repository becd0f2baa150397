//! The keys of the lease table, shared by its parts: Proxies and pools by namespace and name
//! ([`ProxyKey`], the API's), and the table's hash maps.

use std::collections::HashMap;

pub use crate::api::{PoolKey, ProxyKey};

/// The table's maps hash with foldhash: several times faster than SipHash on these short keys, and
/// still randomly seeded. Their keys are ids the store made, Proxies from the cluster and digests.
pub(crate) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

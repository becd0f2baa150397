//! The fleet as every replica sees it: caches of the Proxies, ProxyPools and ProviderHealths,
//! kept current by watches, for the parts that only read them (the status page, the usage
//! meter). The controllers keep their own caches; these run on standbys too, so a standby's
//! status page is as current as the leader's.

use std::future::Future;

use futures_util::StreamExt;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;

use crate::api::{ProviderHealth, Proxy, ProxyPool};

/// Read-only caches of the operator's objects (cheap to clone).
#[derive(Clone)]
pub struct Fleet {
    pub proxies: Store<Proxy>,
    pub pools: Store<ProxyPool>,
    pub providers: Store<ProviderHealth>,
}

impl Fleet {
    /// The caches, and the watches that fill them (Proxies and ProxyPools in `namespace`, or
    /// all) as one future that runs until dropped.
    pub fn watch(
        client: &kube::Client,
        namespace: Option<&str>,
    ) -> (Fleet, impl Future<Output = ()> + Send + 'static) {
        let (pools_api, proxies_api): (Api<ProxyPool>, Api<Proxy>) = match namespace {
            Some(ns) => (
                Api::namespaced(client.clone(), ns),
                Api::namespaced(client.clone(), ns),
            ),
            None => (Api::all(client.clone()), Api::all(client.clone())),
        };
        let (proxies, a) = cache(proxies_api, |proxy: &mut Proxy| {
            // What the page and the meter never show: cloud-init can be 256 KiB a Proxy.
            proxy.spec.cloud_init = None;
            proxy.spec.vendor_data = None;
            proxy.spec.provider_options = None;
        });
        let (pools, b) = cache(pools_api, |pool: &mut ProxyPool| {
            pool.spec.template.spec.cloud_init = None;
            pool.spec.template.spec.vendor_data = None;
            pool.spec.template.spec.provider_options = None;
        });
        let (providers, c) = cache(Api::all(client.clone()), |_: &mut ProviderHealth| {});
        let fleet = Fleet {
            proxies,
            pools,
            providers,
        };
        let watches = async move {
            tokio::join!(a, b, c);
        };
        (fleet, watches)
    }
}

/// One watched cache, trimmed by `trim` before it is stored.
fn cache<K>(api: Api<K>, trim: fn(&mut K)) -> (Store<K>, impl Future<Output = ()> + Send)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        watcher(api, watcher::Config::default().any_semantic())
            .modify(crate::support::kubeclient::trim_for_cache)
            .modify(trim),
    )
    .default_backoff()
    .for_each(|event| {
        if let Err(e) = event {
            tracing::debug!(error = %e, kind = %K::kind(&()), "watching for the status page");
        }
        std::future::ready(())
    });
    (reader, stream)
}

//! DNS for plugin requests: names resolving only to private, loopback or link-local addresses are
//! refused, so a granted wildcard can never reach the cluster's internals or a metadata server.

use std::net::SocketAddr;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use super::allow::is_public;

/// Resolves through the system resolver and keeps public addresses only.
#[derive(Debug)]
pub struct PublicOnlyResolver;

/// Every address of a name was private.
#[derive(Debug, thiserror::Error)]
#[error(
    "{name} resolves only to private or loopback addresses; grant the IP address itself to reach it"
)]
pub struct PrivateAddressDenied {
    pub name: String,
}

impl Resolve for PublicOnlyResolver {
    fn resolve(&self, name: Name) -> Resolving {
        Box::pin(async move {
            let host = name.as_str().to_string();
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await?
                .filter(|a| is_public(a.ip()))
                .collect();
            if addrs.is_empty() {
                return Err(Box::new(PrivateAddressDenied { name: host }) as _);
            }
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

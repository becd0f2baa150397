//! The pool controller's side of provider access: a pool that names an instance its namespace
//! may not use, sets a template field the instance forbids or asks for more replicas than it
//! allows makes and removes no member, as an invalid spec (docs/tenancy.md).

use std::time::Duration;

use kube::ResourceExt;

use super::spec::Invalid;
use crate::api::ProxyPool;
use crate::provider::access;
use crate::provider::providers::ProviderSet;

/// How soon a refused pool is looked at again: a namespace's labels may change without a
/// providers-config change (which looks at once).
pub const RECHECK: Duration = Duration::from_secs(300);

/// Whether a provider instance the pool names refuses it; the refusal as the pool's condition.
pub async fn refusal(
    pool: &ProxyPool,
    client: &kube::Client,
    providers: &ProviderSet,
) -> Result<Option<Invalid>, kube::Error> {
    let providers = providers.current();
    let namespace = pool.namespace().unwrap_or_default();
    let names = access::pool_providers(&pool.spec);
    let rules = names.iter().map(|(_, name)| providers.access(name));
    let labels = crate::lifecycle::access::labels_for(client, &namespace, rules).await?;
    let rules_of = |name: &str| providers.access(name);
    Ok(
        access::check_pool(rules_of, &namespace, &labels, &pool.spec)
            .err()
            .map(|refusal| Invalid {
                reason: "AccessDenied",
                message: refusal.to_string(),
            }),
    )
}

//! Provider access in the controllers and at admission: the namespace's labels when an
//! instance's `namespaceSelector` needs them, and, on the leader, the `ValidatingAdmissionPolicy`
//! generated from the providers config kept applied. The decision itself is
//! `provider::access::check` (pure); the controllers refuse with it where admission did not.

use std::collections::BTreeMap;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
};
use kube::{Client, ResourceExt};

use crate::provider::access::{Rules, policy};
use crate::provider::providers::ProviderSet;

/// The labels of `namespace`, read only when one of `rules` selects namespaces by label.
pub async fn labels_for<'a>(
    client: &Client,
    namespace: &str,
    mut rules: impl Iterator<Item = Option<&'a Rules>>,
) -> Result<BTreeMap<String, String>, kube::Error> {
    if !rules.any(|r| r.is_some_and(Rules::needs_labels)) {
        return Ok(BTreeMap::new());
    }
    let api: Api<Namespace> = Api::all(client.clone());
    Ok(api
        .get_opt(namespace)
        .await?
        .map(|ns| ns.labels().clone())
        .unwrap_or_default())
}

/// The field manager of the admission policy's writes.
const FIELD_MANAGER: &str = "proxy-operator-access";

/// Keeps the admission policy (and binding) `name` as the providers config says, at start and at
/// every providers-config change, until dropped (the leader's task). A failed write is logged
/// and tried again at the next change or after a minute: the controllers refuse in any case.
pub async fn keep_policy(client: Client, providers: ProviderSet, name: String) {
    let mut swaps = Box::pin(providers.swaps());
    let mut applied: Option<Vec<Rules>> = None;
    loop {
        let rules = providers.current().access_rules();
        if applied.as_ref() != Some(&rules) {
            match write_policy(&client, &name, &rules).await {
                Ok(()) => {
                    tracing::info!(policy = %name, restricted = rules.len(), "provider access admission policy applied");
                    applied = Some(rules);
                }
                Err(e) => {
                    tracing::warn!(policy = %name, error = %e, "cannot apply the provider access admission policy (RBAC on validatingadmissionpolicies?); the controllers still refuse what it would");
                }
            }
        }
        let retry = tokio::time::sleep(std::time::Duration::from_secs(60));
        tokio::select! {
            swapped = swaps.next() => if swapped.is_none() { return },
            () = retry => {}
        }
    }
}

/// Applies the policy and binding for `rules` (server-side apply), or deletes them when no
/// instance has an `access` section.
pub async fn write_policy(client: &Client, name: &str, rules: &[Rules]) -> Result<(), kube::Error> {
    let (policies, bindings) = apis(client);
    match policy::manifests(name, rules) {
        Some((vap, binding)) => {
            let params = PatchParams::apply(FIELD_MANAGER).force();
            policies.patch(name, &params, &Patch::Apply(vap)).await?;
            bindings
                .patch(name, &params, &Patch::Apply(binding))
                .await?;
        }
        None => {
            for api in [&bindings, &policies] {
                match api.delete(name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    // RBAC names the default operator id's policy only: another id has none
                    // to delete unless its RBAC was widened for it.
                    Err(kube::Error::Api(e)) if e.code == 403 => {
                        tracing::debug!(policy = %name, error = %e, "may not delete a provider access policy; assuming there is none");
                    }
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(())
}

fn apis(client: &Client) -> (Api<DynamicObject>, Api<DynamicObject>) {
    let resource = |kind: &str| {
        ApiResource::from_gvk(&GroupVersionKind::gvk(
            "admissionregistration.k8s.io",
            "v1",
            kind,
        ))
    };
    (
        Api::all_with(client.clone(), &resource("ValidatingAdmissionPolicy")),
        Api::all_with(
            client.clone(),
            &resource("ValidatingAdmissionPolicyBinding"),
        ),
    )
}

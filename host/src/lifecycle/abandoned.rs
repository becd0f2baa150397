//! Instances their Proxy left running on purpose (`proxy-operator.dev/skip-cleanup`): recorded in
//! the ConfigMap `<operator-id>-abandoned` of the operator's namespace, keyed by the Proxy's UID,
//! so the orphan GC, which would otherwise take them for orphans, leaves them alone.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};

/// Where the abandoned instances are recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AbandonedRecord {
    pub namespace: String,
    pub name: String,
}

impl AbandonedRecord {
    /// The record of the operator installation `operator_id` in `namespace`.
    pub fn new(namespace: &str, operator_id: &str) -> Self {
        AbandonedRecord {
            namespace: namespace.to_string(),
            name: format!("{operator_id}-abandoned"),
        }
    }

    /// Records that the Proxy `uid` left its instance (`what` says which, for people).
    pub async fn record(&self, client: &kube::Client, uid: &str, what: &str) -> kube::Result<()> {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &self.namespace);
        let patch = serde_json::json!({ "data": { uid: what } });
        match api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.is_not_found() => {
                let map = ConfigMap {
                    metadata: kube::api::ObjectMeta {
                        name: Some(self.name.clone()),
                        ..Default::default()
                    },
                    data: Some([(uid.to_string(), what.to_string())].into()),
                    ..Default::default()
                };
                api.create(&PostParams::default(), &map).await.map(|_| ())
            }
            Err(e) => Err(e),
        }
    }

    /// The UIDs of the Proxies whose instances were left running.
    pub async fn owners(&self, client: &kube::Client) -> kube::Result<HashSet<String>> {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &self.namespace);
        Ok(api
            .get_opt(&self.name)
            .await?
            .and_then(|map| map.data)
            .map(|data| data.into_keys().collect())
            .unwrap_or_default())
    }
}

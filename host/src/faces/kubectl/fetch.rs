//! `kubectl px`'s reads from the API server: the kubeconfig's cluster and namespace, the
//! objects `status` and `why` judge, the Proxy's events and the operator's lease table. Thin:
//! what is read is judged by the pure modules beside it.

use k8s_openapi::api::core::v1::{Event, Pod, Secret};
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use super::args::Global;
use super::exit::Failure;
use super::fleet::Fleet;
use super::lease_table::LeaseFacts;
use super::recent_blocks;
use super::table::{millis, rfc3339};
use super::why::EventLine;
use crate::api::labels::LEADER_LABEL;
use crate::api::labels::OPERATOR_LABEL;
use crate::api::{ProviderHealth, Proxy, ProxyPool};
use crate::faces::status_page::blocks_json::{BLOCKS_JSON_PATH, TargetBlocks};
use crate::leasing::leases::LeasePersistence;
use crate::support::kubeclient::list_all;

/// The cluster as the kubeconfig (and `--kubeconfig`, `--context`) says, and the namespace to
/// use: `-n`, else the context's, else `default`.
pub struct Cluster {
    pub client: Client,
    pub config: Config,
    pub namespace: String,
}

pub async fn connect(global: &Global) -> Result<Cluster, Failure> {
    let options = KubeConfigOptions {
        context: global.context.clone(),
        ..Default::default()
    };
    let config = match &global.kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .map_err(|e| Failure::error(format!("{}: {e}", path.display())))?;
            Config::from_custom_kubeconfig(file, &options).await
        }
        None if global.context.is_some() => Config::from_kubeconfig(&options).await,
        None => {
            return match Config::infer().await {
                Ok(config) => cluster(config, global),
                Err(e) => Err(Failure::error(format!(
                    "no cluster to talk to (KUBECONFIG, ~/.kube/config or in-cluster): {e}"
                ))),
            };
        }
    }
    .map_err(|e| Failure::error(format!("reading the kubeconfig: {e}")))?;
    cluster(config, global)
}

fn cluster(config: Config, global: &Global) -> Result<Cluster, Failure> {
    let namespace = global
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = Client::try_from(config.clone())
        .map_err(|e| Failure::error(format!("a client for {}: {e}", config.cluster_url)))?;
    Ok(Cluster {
        client,
        config,
        namespace,
    })
}

/// The lease table, as the leader last wrote it, live at `now_ms`; unreadable is a fact too.
pub async fn lease_facts(
    client: &Client,
    operator_namespace: &str,
    operator_id: &str,
    now_ms: u64,
) -> LeaseFacts {
    let table = LeasePersistence::new(
        client.clone(),
        operator_namespace,
        &format!("{operator_id}-leases"),
    );
    match table.load().await {
        Ok(snapshot) => LeaseFacts::from_snapshot(snapshot, now_ms),
        Err(kube::Error::Api(status)) => LeaseFacts::unreadable(format!(
            "ConfigMaps of namespace {operator_namespace}: {}",
            status.message
        )),
        Err(e) => {
            LeaseFacts::unreadable(format!("ConfigMaps of namespace {operator_namespace}: {e}"))
        }
    }
}

/// Pools, Proxies (of `namespace`, or all), every ProviderHealth and the lease table.
pub async fn fleet(
    cluster: &Cluster,
    namespace: Option<&str>,
    global: &Global,
    now_ms: u64,
) -> Result<Fleet, Failure> {
    let (pools, proxies): (Api<ProxyPool>, Api<Proxy>) = match namespace {
        Some(ns) => (
            Api::namespaced(cluster.client.clone(), ns),
            Api::namespaced(cluster.client.clone(), ns),
        ),
        None => (
            Api::all(cluster.client.clone()),
            Api::all(cluster.client.clone()),
        ),
    };
    let params = ListParams::default();
    let pools = list_all(&pools, &params)
        .await
        .map_err(|e| Failure::kube("listing ProxyPools", e))?;
    let proxies = list_all(&proxies, &params)
        .await
        .map_err(|e| Failure::kube("listing Proxies", e))?;
    // Those of this operator: another installation's provider instances are not its fleet.
    let own = ListParams::default().labels(&format!("{OPERATOR_LABEL}={}", global.operator_id));
    let providers = list_all(&Api::<ProviderHealth>::all(cluster.client.clone()), &own)
        .await
        .map_err(|e| Failure::kube("listing ProviderHealths", e))?;
    let leases = lease_facts(
        &cluster.client,
        &global.operator_namespace,
        &global.operator_id,
        now_ms,
    )
    .await;
    Ok(Fleet {
        pools,
        proxies,
        providers,
        leases,
        now_ms,
        target: None,
        recent_blocks: None,
    })
}

/// How long the leader's blocks may take to read: `status` shows the rest without them.
const BLOCKS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The leader's blocks per target host over the last hour. `Err`: why not, for a note.
pub async fn recent_blocks(
    cluster: &Cluster,
    operator_namespace: &str,
    metrics_url: Option<&str>,
) -> Result<Vec<TargetBlocks>, String> {
    let (source, body) =
        leader_json(cluster, operator_namespace, metrics_url, BLOCKS_JSON_PATH).await?;
    recent_blocks::parse(&body, &source)
}

/// `path` on the leader's metrics port, and where it was read: at `metrics_url` when given,
/// else through the API server's pod proxy to the metrics port of the Pod labelled leader in
/// the operator's namespace. `Err`: why not.
pub async fn leader_json(
    cluster: &Cluster,
    operator_namespace: &str,
    metrics_url: Option<&str>,
    path: &str,
) -> Result<(String, String), String> {
    // The metrics port reads the kubeconfig user's bearer token (TokenReview + RBAC, the
    // ClusterRole proxy-operator-status-reader), unless the operator runs --metrics-insecure.
    let token = kubeconfig_token(&cluster.config);
    match metrics_url {
        Some(url) => {
            let source = recent_blocks::metrics_url_path(url, path);
            let body = get_blocks(&source, token.as_deref())
                .await
                .map_err(|e| recent_blocks::unreachable(&source, &e, true))?;
            Ok((source, body))
        }
        None => {
            let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), operator_namespace);
            let labelled = ListParams::default().labels(&format!("{LEADER_LABEL}=true"));
            let listed = tokio::time::timeout(BLOCKS_TIMEOUT, pods.list(&labelled))
                .await
                .map_err(|_| "no answer".to_string())
                .and_then(|r| r.map_err(|e| e.to_string()));
            let source = format!("the operator's Pods in namespace {operator_namespace}");
            let pods = listed.map_err(|e| recent_blocks::unreachable(&source, &e, false))?;
            let leader = recent_blocks::leader_pod(&pods.items, operator_namespace)?;
            let source = format!(
                "the leader's metrics port through the API server's pod proxy (Pod {operator_namespace}/{}, port {})",
                leader.name, leader.port
            );
            let proxy_path = recent_blocks::pod_proxy_path(operator_namespace, &leader, path);
            let body = pod_proxy_get(&cluster.client, &proxy_path, token.as_deref())
                .await
                .map_err(|e| recent_blocks::unreachable(&source, &e, false))?;
            Ok((source, body))
        }
    }
}

/// GET `url` (`--metrics-url`'s blocks) with the user's `token`, its body when 200.
async fn get_blocks(url: &str, token: Option<&str>) -> Result<String, String> {
    let client = reqwest::Client::builder()
        .timeout(BLOCKS_TIMEOUT)
        .build()
        .map_err(|e| e.to_string())?;
    let mut request = client.get(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.map_err(|e| e.to_string())?;
    let status = response.status();
    let body = response.text().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(recent_blocks::refused(
            status.as_u16(),
            &status.to_string(),
            token.is_some(),
        ));
    }
    Ok(body)
}

/// GET `path` of the API server (the pod proxy), its body. The API server drops the
/// `Authorization` it authenticated the user with, so the user's `token` goes to the metrics
/// port in [`crate::faces::metrics_auth::FORWARDED_TOKEN_HEADER`].
async fn pod_proxy_get(client: &Client, path: &str, token: Option<&str>) -> Result<String, String> {
    // kube's client sends `http` requests; axum re-exports the same `http` crate.
    let mut request = axum::http::Request::get(path);
    if let Some(token) = token {
        request = request.header(
            crate::faces::metrics_auth::FORWARDED_TOKEN_HEADER,
            format!("Bearer {token}"),
        );
    }
    let request = request.body(Vec::new()).map_err(|e| e.to_string())?;
    match tokio::time::timeout(BLOCKS_TIMEOUT, client.request_text(request)).await {
        Err(_) => Err("no answer".into()),
        Ok(Err(kube::Error::Api(status))) if matches!(status.code, 401 | 403) => Err(
            recent_blocks::refused(status.code, &status.message, token.is_some()),
        ),
        Ok(Err(kube::Error::Api(status))) => Err(format!("{} {}", status.code, status.message)),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok(body)) => Ok(body),
    }
}

/// The Proxy's events, oldest first, at most the last `keep`.
pub async fn events(client: &Client, namespace: &str, name: &str, keep: usize) -> Vec<EventLine> {
    let api: Api<Event> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default().fields(&format!(
        "involvedObject.kind=Proxy,involvedObject.name={name}"
    ));
    // Events are context: without them (RBAC, an old API server) `why` still judges the status.
    let Ok(list) = api.list(&params).await else {
        return Vec::new();
    };
    let mut lines: Vec<EventLine> = list.items.into_iter().map(event_line).collect();
    lines.sort_by_key(|e| e.at_ms);
    let skip = lines.len().saturating_sub(keep);
    lines.split_off(skip)
}

fn event_line(event: Event) -> EventLine {
    let at_ms = event
        .series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref())
        .map(|t| t.0.as_millisecond().max(0) as u64)
        .or_else(|| {
            event
                .event_time
                .as_ref()
                .map(|t| t.0.as_millisecond().max(0) as u64)
        })
        .or_else(|| event.last_timestamp.as_ref().map(millis))
        .or_else(|| event.first_timestamp.as_ref().map(millis))
        .or_else(|| event.metadata.creation_timestamp.as_ref().map(millis));
    EventLine {
        type_: event.type_.unwrap_or_default(),
        reason: event.reason.unwrap_or_default(),
        message: event.message.unwrap_or_default(),
        count: event
            .series
            .as_ref()
            .and_then(|s| s.count)
            .or(event.count)
            .map(|c| c.max(0) as u32)
            .unwrap_or(1)
            .max(1),
        at: at_ms.map(rfc3339),
        at_ms,
    }
}

/// The static token of the discovery API, from the operator's Secret (`deploy/operator.yaml`
/// reads `DISCOVERY_TOKEN` from key `token` of `proxy-operator-discovery`).
pub async fn discovery_secret_token(
    client: &Client,
    operator_namespace: &str,
) -> Result<String, String> {
    const SECRET: &str = "proxy-operator-discovery";
    let api: Api<Secret> = Api::namespaced(client.clone(), operator_namespace);
    let secret = api
        .get(SECRET)
        .await
        .map_err(|e| format!("Secret {operator_namespace}/{SECRET}: {e}"))?;
    let token = secret
        .data
        .and_then(|mut d| d.remove("token"))
        .ok_or_else(|| format!("Secret {operator_namespace}/{SECRET} has no key `token`"))?;
    String::from_utf8(token.0)
        .map(|t| t.trim().to_string())
        .map_err(|_| format!("Secret {operator_namespace}/{SECRET}: `token` is not text"))
}

/// The bearer token of the kubeconfig's user, if it has one (`token`, or `tokenFile`).
pub fn kubeconfig_token(config: &Config) -> Option<String> {
    use secrecy::ExposeSecret;
    let auth = &config.auth_info;
    if let Some(token) = &auth.token {
        return Some(token.expose_secret().to_string());
    }
    let file = auth.token_file.as_ref()?;
    std::fs::read_to_string(file)
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}

/// Reads one object, `None` when it does not exist.
pub async fn get_opt<K>(api: &Api<K>, name: &str, what: &str) -> Result<Option<K>, Failure>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name)
        .await
        .map_err(|e| Failure::kube(&format!("reading {what} {name}"), e))
}

/// The ProviderHealth of the Proxy's provider instance, when this operator wrote one (one a
/// user may not read is no reason to fail `why`).
pub async fn provider_health(
    client: &Client,
    provider: &str,
    operator_id: &str,
) -> Option<ProviderHealth> {
    let api: Api<ProviderHealth> = Api::all(client.clone());
    api.get_opt(provider).await.ok().flatten().filter(|h| {
        kube::ResourceExt::labels(h)
            .get(OPERATOR_LABEL)
            .map(String::as_str)
            == Some(operator_id)
    })
}

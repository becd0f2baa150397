//! `kubectl px status`'s recent blocks by target: the hosts that blocked proxies most in the last
//! hour, by name. The lease table keeps hosts only as digests; the leader keeps the names in
//! memory (its block book, `leases/blocks.rs`) and serves them on its metrics port
//! (`/status/blocks.json`), which `status` reaches through the API server's pod proxy, or at
//! `--metrics-url`. Pure: which Pod, which path, what the answer says, the table.

use k8s_openapi::api::core::v1::Pod;

use super::table::{Cell, Table, Tone};
use crate::api::labels::LEADER_LABEL;
use crate::faces::status_page::blocks_json::{RecentBlocks, TargetBlocks};
use crate::leasing::leases::blocks::{NO_TARGET, OTHER_TARGET};

/// The name of the operator container's metrics port (`deploy/operator.yaml`).
pub const METRICS_PORT_NAME: &str = "metrics";
/// `--metrics-addr`'s default port, when the Pod names no port `metrics`.
pub const DEFAULT_METRICS_PORT: u16 = 9090;

/// What to do when the blocks cannot be read through the API server.
const HOW: &str = "pass --metrics-url http://HOST:PORT (the operator's --metrics-addr) when it runs outside the cluster; through the API server, `get` on pods/proxy in the operator's namespace is needed";
/// What to do when `--metrics-url` does not answer.
const HOW_URL: &str = "is it the leader's --metrics-addr (http://HOST:PORT)?";

/// The leader's Pod and its metrics port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderPod {
    pub name: String,
    pub port: u16,
}

/// The leader among the Pods labelled [`LEADER_LABEL`]`=true` in the operator's namespace: a
/// running one first (a former leader cut off from the API server may still carry the label
/// for a moment), then by name.
pub fn leader_pod(labelled: &[Pod], operator_namespace: &str) -> Result<LeaderPod, String> {
    let running = |p: &Pod| {
        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            && p.metadata.deletion_timestamp.is_none()
    };
    let pod = labelled
        .iter()
        .filter(|p| p.metadata.name.is_some())
        .min_by_key(|p| (!running(p), p.metadata.name.clone()))
        .ok_or_else(|| {
            format!(
                "no Pod in namespace {operator_namespace} has the label {LEADER_LABEL}=true (no replica leads, or the operator runs outside the cluster): {HOW}"
            )
        })?;
    let port = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some(METRICS_PORT_NAME))
        .and_then(|p| u16::try_from(p.container_port).ok())
        .unwrap_or(DEFAULT_METRICS_PORT);
    Ok(LeaderPod {
        name: pod.metadata.name.clone().unwrap_or_default(),
        port,
    })
}

/// The API server's pod proxy path to `path` on the leader's metrics port (Pod names are DNS
/// labels: nothing to escape).
pub fn pod_proxy_path(operator_namespace: &str, pod: &LeaderPod, path: &str) -> String {
    format!(
        "/api/v1/namespaces/{operator_namespace}/pods/{}:{}/proxy{path}",
        pod.name, pod.port
    )
}

/// `path` at `--metrics-url`.
pub fn metrics_url_path(metrics_url: &str, path: &str) -> String {
    format!("{}{path}", metrics_url.trim_end_matches('/'))
}

/// A 401 or 403 of the metrics port (`status`, its reason), and what the user needs: a bearer
/// token in the kubeconfig (`with_token`: one was sent) whose user RBAC lets read /status.
pub fn refused(status: u16, reason: &str, with_token: bool) -> String {
    let need = "the kubeconfig's user needs a bearer token and the ClusterRole proxy-operator-status-reader (deploy/metrics-rbac.yaml), or the operator --metrics-insecure";
    match (status, with_token) {
        (401, false) => {
            format!("HTTP {reason}: the kubeconfig has no bearer token to send; {need}")
        }
        (401 | 403, _) => format!("HTTP {reason}: {need}"),
        _ => format!("HTTP {reason}"),
    }
}

/// Why the blocks were not read from `source`, with what to do (`url`: `source` is
/// `--metrics-url`'s, else the API server's).
pub fn unreachable(source: &str, error: &str, url: bool) -> String {
    let how = if url { HOW_URL } else { HOW };
    format!("{source} did not answer ({error}): {how}")
}

/// The blocks in `body`, as `source` (where they were read) answered; a standby's answer is no
/// answer (only the leader counts blocks), and says who leads.
pub fn parse(body: &str, source: &str) -> Result<Vec<TargetBlocks>, String> {
    let answer: RecentBlocks = serde_json::from_str(body).map_err(|e| {
        format!("{source} did not answer with the blocks ({e}); is it the operator's metrics port?")
    })?;
    match answer.replica.as_str() {
        "leader" => Ok(answer.targets),
        _ => Err(format!(
            "{source} is not the leader (a {}{}): blocks are counted by the leader",
            answer.replica,
            answer
                .leader
                .map(|l| format!("; the leader is {l}"))
                .unwrap_or_default()
        )),
    }
}

/// The section: each host with its blocks over the last hour, and what `other` and `none` mean
/// when they appear.
pub fn render(rows: &[TargetBlocks], colour: bool) -> String {
    if rows.is_empty() {
        return "No block reported in the last hour.\n".to_string();
    }
    let mut table = Table::new(&["TARGET", "BLOCKS (LAST HOUR)"]);
    for row in rows {
        let tone = if row.target == OTHER_TARGET || row.target == NO_TARGET {
            Tone::Dim
        } else {
            Tone::Plain
        };
        table.push(vec![
            Cell::new(row.target.clone(), tone),
            row.blocks.to_string().into(),
        ]);
    }
    let mut text = table.render(colour);
    let named = |t: &str| rows.iter().any(|r| r.target == t);
    let legend: Vec<&str> = [
        (
            OTHER_TARGET,
            "other: every host beyond the 20 blocking most",
        ),
        (NO_TARGET, "none: reports naming no host"),
    ]
    .into_iter()
    .filter(|(t, _)| named(t))
    .map(|(_, words)| words)
    .collect();
    if !legend.is_empty() {
        text.push_str(&format!("({})\n", legend.join("; ")));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faces::status_page::blocks_json::BLOCKS_JSON_PATH;
    use k8s_openapi::api::core::v1::{Container, ContainerPort, PodSpec, PodStatus};
    use kube::api::ObjectMeta;

    fn pod(name: &str, phase: &str, metrics_port: Option<i32>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "manager".into(),
                    ports: Some(
                        [
                            Some(ContainerPort {
                                name: Some("discovery".into()),
                                container_port: 8090,
                                ..ContainerPort::default()
                            }),
                            metrics_port.map(|p| ContainerPort {
                                name: Some(METRICS_PORT_NAME.into()),
                                container_port: p,
                                ..ContainerPort::default()
                            }),
                        ]
                        .into_iter()
                        .flatten()
                        .collect(),
                    ),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                ..PodStatus::default()
            }),
        }
    }

    fn blocks(rows: &[(&str, u64)]) -> Vec<TargetBlocks> {
        rows.iter()
            .map(|(target, blocks)| TargetBlocks {
                target: target.to_string(),
                blocks: *blocks,
            })
            .collect()
    }

    #[test]
    fn the_leader_is_the_running_labelled_pod_on_its_metrics_port() {
        let pods = [
            pod("op-b", "Running", Some(9191)),
            pod("op-a", "Failed", Some(9090)),
        ];
        let leader = leader_pod(&pods, "proxy-operator").unwrap();
        assert_eq!(
            leader,
            LeaderPod {
                name: "op-b".into(),
                port: 9191
            }
        );
        assert_eq!(
            pod_proxy_path("proxy-operator", &leader, BLOCKS_JSON_PATH),
            "/api/v1/namespaces/proxy-operator/pods/op-b:9191/proxy/status/blocks.json"
        );
        // No port named `metrics`: the flag's default.
        let unnamed = leader_pod(&[pod("op", "Running", None)], "ns").unwrap();
        assert_eq!(unnamed.port, DEFAULT_METRICS_PORT);
        let none = leader_pod(&[], "proxy-operator").unwrap_err();
        assert!(
            none.starts_with(
                "no Pod in namespace proxy-operator has the label proxy-operator.dev/leader=true"
            ) && none.contains("--metrics-url"),
            "{none}"
        );
    }

    #[test]
    fn a_refusal_of_the_metrics_port_says_what_the_user_needs() {
        // (status, token sent, words)
        let cases = [
            (401, false, "the kubeconfig has no bearer token to send"),
            (401, true, "proxy-operator-status-reader"),
            (403, true, "proxy-operator-status-reader"),
            (404, true, "HTTP 404 Not Found"),
        ];
        for (status, token, words) in cases {
            let reason = if status == 404 {
                "404 Not Found"
            } else {
                "401 Unauthorized"
            };
            let said = refused(status, reason, token);
            assert!(said.contains(words), "{status} {token}: {said}");
            assert_eq!(said.contains("status-reader"), status != 404, "{said}");
        }
    }

    #[test]
    fn a_metrics_url_takes_the_path_with_or_without_its_slash() {
        for url in ["http://127.0.0.1:9090", "http://127.0.0.1:9090/"] {
            assert_eq!(
                metrics_url_path(url, BLOCKS_JSON_PATH),
                "http://127.0.0.1:9090/status/blocks.json"
            );
        }
    }

    #[test]
    fn an_unreachable_source_says_what_to_do() {
        let through = unreachable("the pod proxy", "400 address not allowed", false);
        assert!(
            through.starts_with(
                "the pod proxy did not answer (400 address not allowed): pass --metrics-url"
            ),
            "{through}"
        );
        let url = unreachable("http://x:1/status/blocks.json", "HTTP 404 Not Found", true);
        assert_eq!(
            url,
            "http://x:1/status/blocks.json did not answer (HTTP 404 Not Found): is it the leader's --metrics-addr (http://HOST:PORT)?"
        );
    }

    #[test]
    fn the_leaders_answer_is_read_and_a_standbys_names_the_leader() {
        let leader = r#"{"replica":"leader","windowSeconds":3600,"targets":[{"target":"shop.example","blocks":3},{"target":"none","blocks":1}]}"#;
        assert_eq!(
            parse(leader, "the leader"),
            Ok(blocks(&[("shop.example", 3), ("none", 1)]))
        );
        let standby =
            r#"{"replica":"standby","leader":"op-7d9f","windowSeconds":3600,"targets":[]}"#;
        assert_eq!(
            parse(standby, "http://x:9090"),
            Err("http://x:9090 is not the leader (a standby; the leader is op-7d9f): blocks are counted by the leader".into())
        );
        let html = parse("<html>", "http://x:9090").unwrap_err();
        assert!(
            html.starts_with("http://x:9090 did not answer with the blocks"),
            "{html}"
        );
    }

    #[test]
    fn the_section_lists_hosts_and_explains_other_and_none() {
        let text = render(
            &blocks(&[("shop.example", 3), ("news.example", 1), ("other", 4)]),
            false,
        );
        assert_eq!(
            text,
            "TARGET         BLOCKS (LAST HOUR)\nshop.example   3\nnews.example   1\nother          4\n(other: every host beyond the 20 blocking most)\n"
        );
        let with_none = render(&blocks(&[("none", 2)]), false);
        assert!(
            with_none.ends_with("(none: reports naming no host)\n"),
            "{with_none}"
        );
        assert_eq!(render(&[], false), "No block reported in the last hour.\n");
    }
}

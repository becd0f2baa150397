//! The operator binary as deploy/operator.yaml runs it: the discovery API over TLS from
//! certificate files (`--discovery-tls-cert-file`, `--discovery-tls-key-file`) that are renewed
//! while it runs, and the metrics port without `--metrics-insecure` (a token RBAC allows).

use std::time::Duration;

use harness::process::{Check, wait_for};
use reqwest::StatusCode;

use super::common::InstanceStore;
use super::common::operator_process::{OperatorProcess, OperatorSetup, TOKEN};
use super::common::test_ca::{TestCa, causes, client_trusting};
use super::control_plane;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_binary_serves_tls_renews_its_certificate_and_guards_its_metrics() {
    let cp = control_plane().await;
    let ns = cp.namespace("tls").await.unwrap();
    let store = InstanceStore::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("providers.yaml");
    std::fs::write(
        &config,
        format!("providers:\n{}", super::store_provider("store", &store)),
    )
    .unwrap();
    let config = config.to_str().unwrap().to_string();
    let tls_dir = dir.path().join("discovery-tls");
    std::fs::create_dir(&tls_dir).unwrap();
    let (first_ca, second_ca) = (TestCa::new("first CA"), TestCa::new("second CA"));
    let files = first_ca.write(&tls_dir, &["localhost"]);
    let mut operator = OperatorProcess::start_with(OperatorSetup {
        health_interval: "0s",
        discovery_tls: Some((files.cert.clone(), files.key.clone())),
        metrics_insecure: false,
        ..OperatorProcess::setup(cp, &ns, dir.path(), &config, "127.0.0.1:9")
    });
    // The probes need no token.
    operator.wait_leading().await;
    let url = format!("https://localhost:{}/v1/proxies", operator.discovery.port());
    let proxies = |ca: &str| {
        let request = client_trusting(ca).get(&url).bearer_auth(TOKEN).send();
        async move { request.await.map(|r| r.status()) }
    };
    assert_eq!(proxies(&first_ca.pem).await.unwrap(), StatusCode::OK);
    let refused = proxies(&second_ca.pem).await.unwrap_err();
    assert!(
        causes(&refused).contains("certificate"),
        "{}",
        causes(&refused)
    );
    let plain = reqwest::get(format!("http://{}/v1/proxies", operator.discovery)).await;
    assert!(plain.is_err(), "plain HTTP to the TLS port: {plain:?}");

    // The Secret renewed (another CA, here): new connections get it within a few reads.
    second_ca.write(&tls_dir, &["localhost"]);
    wait_for(
        "the renewed certificate",
        Duration::from_secs(30),
        || async {
            match proxies(&second_ca.pem).await {
                Ok(StatusCode::OK) => Check::Ready(()),
                other => Check::NotYet(format!("{other:?}")),
            }
        },
    )
    .await
    .unwrap();

    // /metrics: 401 without a token, served to the kubeconfig's user (an admin).
    let metrics = format!("http://{}/metrics", operator.metrics);
    let bare = reqwest::get(&metrics).await.unwrap();
    assert_eq!(bare.status(), StatusCode::UNAUTHORIZED);
    let allowed = reqwest::Client::new()
        .get(&metrics)
        .bearer_auth(cp.token())
        .send()
        .await
        .unwrap();
    assert_eq!(allowed.status(), StatusCode::OK);
    assert!(allowed.text().await.unwrap().contains("proxy_operator_"));

    let log = operator.proc.log_tail(400);
    assert!(log.contains("TLS certificate loaded"), "{log}");
    assert!(
        !log.contains("PRIVATE KEY") && !log.contains(cp.token()),
        "a secret reached the log"
    );
}

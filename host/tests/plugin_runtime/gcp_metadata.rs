//! `valueFrom.gcpMetadataServer` (GKE Workload Identity, issue #53): the host GETs an access token
//! from the metadata server — here a loopback server answering in Google's documented shape
//! (`GET /computeMetadata/v1/instance/service-accounts/ACCOUNT/token` with `Metadata-Flavor:
//! Google`, `{"access_token", "expires_in", "token_type"}`) — once for many requests, and sends it
//! as the grant's header; the plugin sees none of it. No key file anywhere.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::http::{HeaderMap, StatusCode};
use serde_json::json;

use super::aws_signing::echoing_provider;
use super::common::*;
use proxy_operator::provider::capabilities::Grants;

const TOKEN: &str = "ya29.metadata-server-token-for-the-test";

/// A metadata server on loopback: the token for `proxies@…` when asked with the flavor header,
/// 403 (as the real one answers) without it; every request counted.
async fn metadata_server() -> (String, Arc<AtomicUsize>) {
    let fetches = Arc::new(AtomicUsize::new(0));
    let counted = fetches.clone();
    let server = axum::Router::new().route(
        "/computeMetadata/v1/instance/service-accounts/{account}/token",
        axum::routing::get(
            move |axum::extract::Path(account): axum::extract::Path<String>, headers: HeaderMap| {
                let counted = counted.clone();
                async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                    let flavored =
                        headers.get("metadata-flavor").map(|v| v.as_bytes()) == Some(b"Google");
                    if !flavored || account != "proxies@project.iam.gserviceaccount.com" {
                        return (
                            StatusCode::FORBIDDEN,
                            "Missing Metadata-Flavor:Google header.".to_string(),
                        );
                    }
                    let token =
                        json!({"access_token": TOKEN, "expires_in": 3599, "token_type": "Bearer"});
                    (StatusCode::OK, token.to_string())
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let host = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, server).await.unwrap() });
    (host, fetches)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workload_identity_tokens_come_from_the_metadata_server_once() {
    let (host, fetches) = metadata_server().await;
    let store = InstanceStore::start().await;
    let grants = |account: &str| {
        json!({"http": {
            "allow": [store.url()],
            "credentials": [{
                "url": store.url(),
                "header": "Authorization",
                "prefix": "Bearer ",
                "valueFrom": {"gcpMetadataServer": {"host": host, "serviceAccount": account}},
            }],
        }})
    };
    let provider =
        echoing_provider(&store, grants("proxies@project.iam.gserviceaccount.com")).await;
    for _ in 0..3 {
        let echoed = provider
            .create(spec("x", json!({ "misbehave": "echo" })))
            .await
            .unwrap();
        let plugin_view = echoed.message.unwrap();
        assert!(!plugin_view.contains(TOKEN), "{plugin_view}");
    }
    assert_eq!(
        fetches.load(Ordering::SeqCst),
        1,
        "fetched once, then cached"
    );
    let seen = store.state.echo_headers.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    for headers in &seen {
        assert_eq!(headers["authorization"], format!("Bearer {TOKEN}").as_str());
    }

    // An account the metadata server does not serve: the call fails with its answer, and the
    // request is not sent without its credential.
    let refused = echoing_provider(&store, grants("other@project.iam.gserviceaccount.com")).await;
    let error = refused
        .create(spec("x", json!({ "misbehave": "echo" })))
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("403"), "{error}");
    assert!(
        error.contains("other@project.iam.gserviceaccount.com"),
        "{error}"
    );
    assert_eq!(store.state.echo_headers.lock().unwrap().len(), 3);
}

/// Only the metadata server's own names or loopback: a grant cannot aim the operator's token at
/// another host by naming it as the metadata server.
#[test]
fn a_metadata_server_elsewhere_is_refused_when_the_grant_is_read() {
    for host in [
        "attacker.example",
        "10.0.0.5",
        "metadata.google.internal.attacker.example",
    ] {
        let grants: Grants = serde_json::from_value(json!({"http": {
            "allow": ["https://compute.googleapis.com"],
            "credentials": [{
                "url": "https://compute.googleapis.com",
                "header": "Authorization",
                "prefix": "Bearer ",
                "valueFrom": {"gcpMetadataServer": {"host": host}},
            }],
        }}))
        .unwrap();
        let error = grants.validate().unwrap_err().to_string();
        assert!(error.contains("gcpMetadataServer.host"), "{host}: {error}");
        assert!(
            error.contains("is not the metadata server"),
            "{host}: {error}"
        );
    }
}

//! `valueFrom.awsCredentials`: the host signs a plugin's requests with SigV4. The server gets a
//! signature that the SDK's signer, given the same keys, computes again from what arrived; the
//! plugin gets the server's answer and nothing of the keys, the signature or the session token.

use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use axum::http::HeaderMap;
use serde_json::json;

use super::common::*;
use proxy_operator::provider::capabilities::Grants;
use proxy_operator::provider::plugins::{ProviderInstance, ProviderInstanceOptions};

const ACCESS_KEY_ID: &str = "AKIDPROXYOPERATORTEST";
const SECRET_ACCESS_KEY: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYsecretkey";
const SESSION_TOKEN: &str = "FwoGZXIvYXdzEXAMPLEsessiontoken";

/// The test plugin, whose `misbehave: echo` create sends a request to the store's `/echo` (which
/// records its headers) and answers with what it saw, bound with `grants`.
pub(super) async fn echoing_provider(
    store: &InstanceStore,
    grants: serde_json::Value,
) -> ProviderInstance {
    let (engine, _) = engine_with(test_options()).await;
    let plugin = load_test_plugin(&engine).await;
    let grants: Grants = serde_json::from_value(grants).unwrap();
    ProviderInstance::new(
        engine,
        "aws-signed",
        plugin,
        &json!({ "endpoint": store.url() }),
        &grants.validate().unwrap(),
        ProviderInstanceOptions::default(),
    )
    .unwrap()
}

/// The `x-amz-date` of a signed request as a time (`20261204T211500Z`).
fn signing_time(date: &str) -> SystemTime {
    let rfc3339 = format!(
        "{}-{}-{}T{}:{}:{}Z",
        &date[0..4],
        &date[4..6],
        &date[6..8],
        &date[9..11],
        &date[11..13],
        &date[13..15]
    );
    std::time::SystemTime::from(rfc3339.parse::<k8s_openapi::jiff::Timestamp>().unwrap())
}

/// The Authorization SigV4 gives the GET `url` with the signed headers of `seen`, signed with
/// `keys` in eu-west-1 for ec2 at the request's own time.
fn expected_authorization(seen: &HeaderMap, url: &str, keys: Credentials) -> String {
    let authorization = seen["authorization"].to_str().unwrap();
    let signed_names = authorization
        .split("SignedHeaders=")
        .nth(1)
        .unwrap()
        .split(',')
        .next()
        .unwrap();
    let headers: Vec<(&str, &str)> = signed_names
        .split(';')
        .map(|name| (name, seen[name].to_str().unwrap()))
        .collect();
    let identity = keys.into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region("eu-west-1")
        .name("ec2")
        .time(signing_time(seen["x-amz-date"].to_str().unwrap()))
        .settings(SigningSettings::default())
        .build()
        .unwrap()
        .into();
    let request =
        SignableRequest::new("GET", url, headers.into_iter(), SignableBody::Bytes(b"")).unwrap();
    let (instructions, _) = sign(request, &params).unwrap().into_parts();
    instructions
        .headers()
        .find(|(name, _)| *name == "authorization")
        .unwrap()
        .1
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigv4_signatures_reach_the_server_but_no_key_reaches_the_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, value: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("{value}\n")).unwrap();
        path
    };
    let (id, secret, token) = (
        file("id", ACCESS_KEY_ID),
        file("secret", SECRET_ACCESS_KEY),
        file("token", SESSION_TOKEN),
    );
    let store = InstanceStore::start().await;
    let provider = echoing_provider(
        &store,
        json!({"http": {
            "allow": [store.url()],
            "credentials": [{
                "url": store.url(),
                "valueFrom": {"awsCredentials": {
                    "region": "eu-west-1",
                    "accessKeyIdFrom": {"file": id},
                    "secretAccessKeyFrom": {"file": secret},
                    "sessionTokenFrom": {"file": token},
                }},
            }],
        }}),
    )
    .await;

    let echoed = provider
        .create(spec("x", json!({ "misbehave": "echo" })))
        .await
        .unwrap();
    let seen = store.state.echo_headers.lock().unwrap()[0].clone();
    let authorization = seen["authorization"].to_str().unwrap();
    let day = &seen["x-amz-date"].to_str().unwrap()[..8];
    assert!(
        authorization.starts_with(&format!(
            "AWS4-HMAC-SHA256 Credential={ACCESS_KEY_ID}/{day}/eu-west-1/ec2/aws4_request, SignedHeaders="
        )),
        "{authorization}"
    );
    assert_eq!(seen["x-amz-security-token"], SESSION_TOKEN);
    // The server can check it: the same keys sign the same request to the same signature.
    let url = format!("{}/echo", store.url());
    assert_eq!(
        authorization,
        expected_authorization(
            &seen,
            &url,
            Credentials::new(
                ACCESS_KEY_ID,
                SECRET_ACCESS_KEY,
                Some(SESSION_TOKEN.into()),
                None,
                "test"
            )
        )
    );
    let signature = authorization.split("Signature=").nth(1).unwrap();
    let plugin_view = echoed.message.unwrap();
    for secret in [SECRET_ACCESS_KEY, SESSION_TOKEN, signature, ACCESS_KEY_ID] {
        assert!(!plugin_view.contains(secret), "{plugin_view}");
    }

    // A rotated Secret (the mounted files change) signs the next request.
    std::fs::write(dir.path().join("id"), "AKIDROTATEDKEY").unwrap();
    provider
        .create(spec("x", json!({ "misbehave": "echo" })))
        .await
        .unwrap();
    let seen = store.state.echo_headers.lock().unwrap()[1].clone();
    assert!(
        seen["authorization"]
            .to_str()
            .unwrap()
            .contains("Credential=AKIDROTATEDKEY/"),
        "{:?}",
        seen["authorization"]
    );
}

/// A web identity (IRSA's projected token) is exchanged at moto's STS for temporary keys, once
/// for many requests; the requests are signed with them and carry their session token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_web_identity_is_exchanged_at_sts_once_and_signs_requests() {
    let moto = harness::Moto::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(
        &token_file,
        "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW0ifQ.c2ln\n",
    )
    .unwrap();
    let store = InstanceStore::start().await;
    let provider = echoing_provider(
        &store,
        json!({"http": {
            "allow": [store.url()],
            "credentials": [{
                "url": store.url(),
                "valueFrom": {"awsCredentials": {
                    "region": "eu-west-1",
                    "webIdentityTokenFile": token_file,
                    "roleArn": "arn:aws:iam::123456789012:role/proxy-operator",
                    "stsEndpoint": moto.url(),
                }},
            }],
        }}),
    )
    .await;
    for _ in 0..3 {
        let echoed = provider
            .create(spec("x", json!({ "misbehave": "echo" })))
            .await
            .unwrap();
        assert!(!echoed.message.unwrap().contains("ASIA"));
    }
    let seen = store.state.echo_headers.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    let key_of = |h: &HeaderMap| {
        h["authorization"]
            .to_str()
            .unwrap()
            .split("Credential=")
            .nth(1)
            .unwrap()
            .split('/')
            .next()
            .unwrap()
            .to_string()
    };
    let key = key_of(&seen[0]);
    // STS's temporary keys start with ASIA; the exchange was cached for the later requests.
    assert!(key.starts_with("ASIA"), "{key}");
    assert!(seen.iter().all(|h| key_of(h) == key));
    let token = seen[0]["x-amz-security-token"].to_str().unwrap();
    assert!(token.len() > 20, "{token}");
    let exchanges = moto
        .log_tail(200)
        .lines()
        .filter(|l| l.contains("POST / HTTP"))
        .count();
    assert_eq!(
        exchanges,
        1,
        "one AssumeRoleWithWebIdentity:\n{}",
        moto.log_tail(40)
    );
}

/// EKS Pod Identity: the host GETs temporary keys from the container credentials endpoint (here a
/// loopback server answering in AWS's documented shape) with the Pod's token file as
/// `Authorization`, once for many requests, and signs with them; the plugin sees none of it. An
/// endpoint that refuses the token fails the call saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_identity_keys_come_from_the_container_credentials_endpoint_once() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    const POD_TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.cG9kLWlkZW50aXR5.c2ln";
    const POD_KEY: &str = "ASIAPODIDENTITYTEST";
    let fetches = Arc::new(AtomicUsize::new(0));
    let counted = fetches.clone();
    let agent = axum::Router::new().route(
        "/v1/credentials",
        axum::routing::get(move |headers: HeaderMap| {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                if headers.get("authorization").map(|v| v.as_bytes()) != Some(POD_TOKEN.as_bytes())
                {
                    let refused =
                        json!({"code": "AccessDeniedException", "message": "invalid token"});
                    return (axum::http::StatusCode::UNAUTHORIZED, refused.to_string());
                }
                let expires = k8s_openapi::jiff::Timestamp::now()
                    + k8s_openapi::jiff::SignedDuration::from_secs(3600);
                let keys = json!({
                    "AccessKeyId": POD_KEY,
                    "SecretAccessKey": SECRET_ACCESS_KEY,
                    "Token": SESSION_TOKEN,
                    "AccountId": "123456789012",
                    "Expiration": expires.to_string(),
                });
                (axum::http::StatusCode::OK, keys.to_string())
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let full_uri = format!("http://{}/v1/credentials", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, agent).await.unwrap() });
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("eks-pod-identity-token");
    std::fs::write(&token_file, format!("{POD_TOKEN}\n")).unwrap();
    let store = InstanceStore::start().await;
    let grants = |token_file: &std::path::Path| {
        json!({"http": {
            "allow": [store.url()],
            "credentials": [{
                "url": store.url(),
                "valueFrom": {"awsCredentials": {
                    "region": "eu-west-1",
                    "containerCredentials": {
                        "fullUri": full_uri,
                        "authorizationTokenFile": token_file,
                    },
                }},
            }],
        }})
    };
    let provider = echoing_provider(&store, grants(&token_file)).await;
    for _ in 0..3 {
        let echoed = provider
            .create(spec("x", json!({ "misbehave": "echo" })))
            .await
            .unwrap();
        let plugin_view = echoed.message.unwrap();
        for secret in [SECRET_ACCESS_KEY, SESSION_TOKEN, POD_TOKEN, POD_KEY] {
            assert!(!plugin_view.contains(secret), "{plugin_view}");
        }
    }
    assert_eq!(
        fetches.load(Ordering::SeqCst),
        1,
        "fetched once, then cached"
    );
    let seen = store.state.echo_headers.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[2]["x-amz-security-token"], SESSION_TOKEN);
    let url = format!("{}/echo", store.url());
    let keys = Credentials::new(
        POD_KEY,
        SECRET_ACCESS_KEY,
        Some(SESSION_TOKEN.into()),
        None,
        "test",
    );
    assert_eq!(
        seen[2]["authorization"].to_str().unwrap(),
        expected_authorization(&seen[2], &url, keys)
    );

    // A token the agent refuses: the call fails with the agent's answer, nothing is sent.
    let wrong = dir.path().join("wrong-token");
    std::fs::write(&wrong, "not-the-pod-token").unwrap();
    let refused = echoing_provider(&store, grants(&wrong)).await;
    let error = refused
        .create(spec("x", json!({ "misbehave": "echo" })))
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("401"), "{error}");
    assert!(error.contains("AccessDeniedException"), "{error}");
    assert!(!error.contains("not-the-pod-token"), "{error}");
    assert_eq!(store.state.echo_headers.lock().unwrap().len(), 3);
}

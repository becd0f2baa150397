//! Credentials on the proxy (the operator binary, the test provider, a real squid that requires
//! basic auth): the operator makes each Proxy's Secret, the plugin gets only the salted hash,
//! probes and a lease's `proxyUrl` use the password, and rotating the Secret rotates the proxy's
//! credentials.

use std::time::Duration;

use harness::Squid;
use harness::process::{Check, wait_for};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use proxy_operator::api::Proxy;
use reqwest::{Method, StatusCode};
use sha_crypt::{PasswordVerifier, ShaCrypt};

use super::proxy_yaml;
use super::world::World;

/// What the test provider's store holds for `proxy`: the credentials the host gave the plugin.
fn stored_credentials(world: &World, uid: &str) -> Option<serde_json::Value> {
    let instances = world.store.state.instances.lock().unwrap();
    instances
        .values()
        .find(|i| i["owner"]["uid"] == uid)
        .map(|i| i["credentials"].clone())
        .filter(|c| !c.is_null())
}

/// What egress-1's status says its squid was given.
async fn recorded_credentials(proxies: &Api<Proxy>) -> proxy_operator::api::CredentialsStatus {
    let proxy = proxies.get("egress-1").await.unwrap();
    proxy.status.unwrap().credentials.unwrap()
}

/// The Secret's password.
async fn password_of(secrets: &Api<Secret>, name: &str) -> String {
    let secret = secrets.get(name).await.unwrap();
    let bytes = &secret.data.unwrap()["password"].0;
    String::from_utf8(bytes.clone()).unwrap()
}

/// A GET through `proxy_url` (which may carry credentials): the status squid or the page gave.
pub(crate) async fn fetch_through(proxy_url: &str, page: &str) -> StatusCode {
    let client = reqwest::Client::builder()
        .proxy(reqwest::Proxy::http(proxy_url).unwrap())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    client.get(page).send().await.unwrap().status()
}

/// Waits until the plugin was handed credentials whose hash checks `password`, and gives squid
/// that password file (what the provider's own squid would read).
async fn squid_gets_credentials_of(world: &World, uid: &str, password: &str) -> String {
    let line = wait_for(
        "the plugin got credentials for the password",
        Duration::from_secs(60),
        || async {
            let Some(stored) = stored_credentials(world, uid) else {
                return Check::NotYet("none yet".to_string());
            };
            let hash = stored["passwordHash"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let parsed = sha_crypt::PasswordHash::new(&hash).unwrap();
            match ShaCrypt::SHA512.verify_password(password.as_bytes(), &parsed) {
                Ok(()) => {
                    Check::Ready(format!("{}:{hash}\n", stored["username"].as_str().unwrap()))
                }
                Err(_) => Check::NotYet(format!("a hash of another password: {stored}")),
            }
        },
    )
    .await
    .unwrap();
    world.squid.set_passwords(&line).unwrap();
    line
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_requires_its_secrets_credentials_and_rotating_the_secret_rotates_them() {
    let world =
        World::start_with_squid("px-creds", Squid::start_requiring_login().await.unwrap()).await;
    let operator = world.operator().await;
    let ns = world.ns.name().to_string();
    let proxies: Api<Proxy> = world.ns.api();
    let secrets: Api<Secret> = world.ns.api();
    let page = world.target.url("/page");
    world.target.serve("/page", b"through squid".to_vec());

    let yaml =
        proxy_yaml(&ns, "egress-1", "store", "") + &format!("  port: {}\n", world.squid.port());
    world
        .cp
        .kubectl_run(&["apply", "-f", "-"], Some(&yaml))
        .await
        .unwrap();

    // The Secret: made by the operator, owned by the Proxy, a long random password.
    let secret = wait_for(
        "the credentials Secret",
        Duration::from_secs(60),
        || async {
            match secrets.get_opt("egress-1-proxy-credentials").await.unwrap() {
                Some(s) => Check::Ready(s),
                None => Check::NotYet("not yet".to_string()),
            }
        },
    )
    .await
    .unwrap();
    let uid = proxies.get("egress-1").await.unwrap().metadata.uid.unwrap();
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/basic-auth"));
    assert_eq!(
        secret.metadata.owner_references.as_ref().unwrap()[0].uid,
        uid
    );
    let password = password_of(&secrets, "egress-1-proxy-credentials").await;
    assert_eq!(password.len(), 32);

    // The plugin got the hash, never the password; squid gets that line.
    let line = squid_gets_credentials_of(&world, &uid, &password).await;
    assert!(!line.contains(&password));
    let stored = stored_credentials(&world, &uid).unwrap().to_string();
    assert!(!stored.contains(&password), "{stored}");

    // The health probe logs in, so the proxy becomes leasable; the lease's proxyUrl carries the
    // credentials and works, the bare address gets squid's 407.
    let mut operator = operator;
    let lease = operator.lease(&format!("{ns}/egress-1")).await;
    let (status, granted) = operator
        .call(Method::GET, &format!("/v1/leases/{lease}"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{granted}");
    let proxy_url = granted["proxyUrl"].as_str().unwrap().to_string();
    assert_eq!(
        proxy_url,
        format!(
            "http://egress-1:{password}@127.0.0.1:{}",
            world.squid.port()
        )
    );
    assert_eq!(fetch_through(&proxy_url, &page).await, StatusCode::OK);
    let bare = format!("http://127.0.0.1:{}", world.squid.port());
    assert_eq!(
        fetch_through(&bare, &page).await,
        StatusCode::PROXY_AUTHENTICATION_REQUIRED
    );
    // The listing is for operators: no credentials in it.
    let (_, listed) = operator.call(Method::GET, "/v1/proxies", None).await;
    assert!(!listed.to_string().contains(&password), "{listed}");
    let recorded = recorded_credentials(&proxies).await;
    assert_eq!(recorded.secret_name, "egress-1-proxy-credentials");

    // Rotation: a new password in the Secret reaches the plugin (as a hash) at once, the status
    // records it, and the next lease's proxyUrl has it.
    let rotated = "n3w-Passw0rd-for/egress";
    let patch = serde_json::json!({"stringData": {"password": rotated}});
    secrets
        .patch(
            "egress-1-proxy-credentials",
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await
        .unwrap();
    squid_gets_credentials_of(&world, &uid, rotated).await;
    wait_for(
        "the status records the rotation",
        Duration::from_secs(60),
        || async {
            let now = recorded_credentials(&proxies).await;
            if now.fingerprint != recorded.fingerprint {
                Check::Ready(())
            } else {
                Check::NotYet("old fingerprint".to_string())
            }
        },
    )
    .await
    .unwrap();
    let (status, _) = operator
        .call(Method::DELETE, &format!("/v1/leases/{lease}"), None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let second = operator.lease(&format!("{ns}/egress-1")).await;
    let (_, granted) = operator
        .call(Method::GET, &format!("/v1/leases/{second}"), None)
        .await;
    let new_url = granted["proxyUrl"].as_str().unwrap().to_string();
    assert!(new_url.contains("n3w-Passw0rd-for%2Fegress@"), "{new_url}");
    assert_eq!(fetch_through(&new_url, &page).await, StatusCode::OK);
    // The old password no longer opens the proxy (squid forgets a checked one within 5 s).
    wait_for(
        "the old password refused",
        Duration::from_secs(30),
        || async {
            match fetch_through(&proxy_url, &page).await {
                StatusCode::PROXY_AUTHENTICATION_REQUIRED => Check::Ready(()),
                other => Check::NotYet(other.to_string()),
            }
        },
    )
    .await
    .unwrap();

    // No password ever in the operator's log.
    let log = std::fs::read_to_string(operator.proc.log_path()).unwrap();
    for secret in [password.as_str(), rotated] {
        assert!(!log.contains(secret), "the operator logged a password");
    }
}

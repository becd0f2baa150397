//! The sandbox against a hostile plugin (`plugins/hostile-provider`), through the real runtime:
//! each attempt is a named case that asserts the host's bound held.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proxy_operator::provider::capabilities::Grants;
use proxy_operator::provider::capabilities::log::LOG_BURST;
use proxy_operator::provider::plugins::bounds::{
    MAX_CHECK_TARGETS, MAX_LIST_INSTANCES, MAX_MESSAGE_BYTES,
};
use proxy_operator::provider::plugins::types::{InstanceSpec, Owner, ProviderError};
use proxy_operator::provider::plugins::{CallError, ProviderInstance, ProviderInstanceOptions};
use rstest::rstest;

use common::{engine_with, plugin_bytes, test_options};

/// The hostile provider bound to `attempt` (and its size `n`).
async fn hostile(attempt: &str, n: u64) -> ProviderInstance {
    hostile_with(
        serde_json::json!({ "attempt": attempt, "n": n }),
        Grants::default(),
    )
    .await
}

async fn hostile_with(config: serde_json::Value, grants: Grants) -> ProviderInstance {
    let (engine, _) = engine_with(test_options()).await;
    let plugin = engine
        .load("hostile.wasm", plugin_bytes("hostile"))
        .await
        .expect("the hostile plugin loads");
    ProviderInstance::new(
        engine,
        "hostile-test",
        plugin,
        &config,
        &grants.validate().unwrap(),
        ProviderInstanceOptions::default(),
    )
    .unwrap()
}

fn spec() -> InstanceSpec {
    InstanceSpec {
        name: "px-1".into(),
        owner: Owner {
            namespace: "crawlers".into(),
            name: "egress-1".into(),
            uid: "u-1".into(),
            operator_id: "test".into(),
        },
        zone: None,
        image: None,
        machine_type: None,
        user_data: Vec::new(),
        vendor_data: Vec::new(),
        install_guest_agent: false,
        port: 3128,
        labels: Vec::new(),
        options: serde_json::json!({}),
        credentials: None,
    }
}

fn provider_error(result: Result<impl std::fmt::Debug, CallError>) -> ProviderError {
    match result {
        Err(CallError::Provider { error, .. }) => error,
        other => panic!("expected the provider's own error, got {other:?}"),
    }
}

#[rstest]
#[case::retry_after_zero_is_a_second("retry-after-zero", Duration::from_secs(1))]
#[case::retry_after_2_pow_64_is_an_hour("retry-after-huge", Duration::from_secs(3600))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_hints_are_clamped(#[case] attempt: &str, #[case] expected: Duration) {
    let provider = hostile(attempt, 0).await;
    match provider_error(provider.create(spec()).await) {
        ProviderError::Transient { retry_after, .. } => assert_eq!(retry_after, Some(expected)),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_megabyte_error_message_is_cut() {
    let provider = hostile("long-error", 1 << 20).await;
    let ProviderError::Permanent(message) = provider_error(provider.get("x").await) else {
        panic!()
    };
    assert!(message.len() <= MAX_MESSAGE_BYTES + 64, "{}", message.len());
    assert!(
        message.ends_with("(1048576 bytes, cut)"),
        "{}",
        &message[message.len() - 40..]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_megabyte_instance_message_is_cut() {
    let provider = hostile("long-instance-message", 1 << 20).await;
    let instance = provider.create(spec()).await.unwrap();
    assert!(instance.message.unwrap().len() <= MAX_MESSAGE_BYTES + 64);
}

#[rstest]
#[case::list_over_the_cap_is_refused("huge-list", MAX_LIST_INSTANCES as u64 + 1, "10001 instances")]
#[case::check_over_the_cap_is_refused("huge-check", MAX_CHECK_TARGETS as u64 + 1, "257 check targets")]
#[case::a_4_kib_check_reason_is_refused("long-check-reason", 0, "reason is 4096 bytes")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_answers_are_refused(#[case] attempt: &str, #[case] n: u64, #[case] says: &str) {
    let provider = hostile(attempt, n).await;
    let error = if attempt.ends_with("list") {
        provider_error(provider.list().await)
    } else {
        provider_error(provider.check().await)
    };
    assert!(error.to_string().contains(says), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_within_the_caps_pass() {
    let provider = hostile("huge-list", 100).await;
    assert_eq!(provider.list().await.unwrap().len(), 100);
    let provider = hostile("huge-check", 3).await;
    let targets = provider.check().await.unwrap();
    assert_eq!(targets.len(), 3);
    assert!(targets[0].message.len() <= MAX_MESSAGE_BYTES + 64);
}

/// A log writer the test reads back.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_flood_is_rate_limited_per_provider_instance() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let provider = hostile("log-flood", 5000).await;
    provider.create(spec()).await.unwrap();
    // A second call of the same provider instance shares the budget.
    provider.create(spec()).await.unwrap();
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let written = text.matches("flood line").count();
    assert!(written >= LOG_BURST as usize, "{written} lines written");
    // The burst, plus what the rate refilled during the calls (well under a second each).
    assert!(
        written < LOG_BURST as usize + 200,
        "{written} of 10000 lines written"
    );
    assert!(text.contains("plugin log lines dropped"), "no drop notice");
}

/// What reached the loopback server: method, `Host` and `Authorization` of each request.
type Seen = Arc<Mutex<Vec<(String, String, String)>>>;

/// A loopback HTTP server that records every request it gets.
/// The plugin's create is refused as `Denied` saying `says`, and nothing reached the server.
async fn refused_before_sending(provider: &ProviderInstance, seen: &Seen, says: &str) {
    let ProviderError::Denied(message) = provider_error(provider.create(spec()).await) else {
        panic!()
    };
    assert!(message.contains(says), "{message}");
    assert!(
        seen.lock().unwrap().is_empty(),
        "a request reached the server: {:?}",
        seen.lock().unwrap()
    );
}

async fn recording_server() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let record = seen.clone();
    let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
        let record = record.clone();
        async move {
            let header = |name: &str| {
                request
                    .headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string()
            };
            record.lock().unwrap().push((
                request.method().to_string(),
                header("host"),
                header("authorization"),
            ));
            "ok"
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, seen)
}

/// The http grant of the loopback server, with a bearer token the host injects from a file.
fn http_grant(base: &str, token_file: &std::path::Path) -> Grants {
    serde_json::from_value(serde_json::json!({
        "http": {
            "allow": [base],
            "credentials": [{
                "url": base,
                "header": "Authorization",
                "prefix": "Bearer ",
                "valueFrom": { "file": token_file },
            }],
        }
    }))
    .unwrap()
}

#[rstest]
#[case::host_naming_another_virtual_host("GET", &[("Host", "other.internal")], "header `host` is set by the host only")]
#[case::trace("TRACE", &[], "method `TRACE` is not allowed")]
#[case::connect("CONNECT", &[], "method `CONNECT` is not allowed")]
#[case::proxy_authorization("GET", &[("Proxy-Authorization", "Basic eA==")], "header `proxy-authorization`")]
#[case::connection("GET", &[("Connection", "upgrade")], "header `connection`")]
#[case::transfer_encoding("POST", &[("Transfer-Encoding", "chunked")], "header `transfer-encoding`")]
#[case::content_length("POST", &[("Content-Length", "1000")], "header `content-length`")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_the_host_alone_may_shape_are_refused(
    #[case] method: &str,
    #[case] headers: &[(&str, &str)],
    #[case] says: &str,
) {
    let (base, seen) = recording_server().await;
    let token = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token.path(), "s3cret").unwrap();
    let provider = hostile_with(
        serde_json::json!({
            "attempt": "http", "method": method, "url": format!("{base}/x"), "headers": headers,
        }),
        http_grant(&base, token.path()),
    )
    .await;
    refused_before_sending(&provider, &seen, says).await;
}

/// The same request without the forbidden part goes through, with the injected credential: the
/// refusals above are about the header or method, not the grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordinary_request_gets_the_injected_credential() {
    let (base, seen) = recording_server().await;
    let token = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token.path(), "s3cret").unwrap();
    let provider = hostile_with(
        serde_json::json!({
            "attempt": "http", "method": "GET", "url": format!("{base}/x"), "headers": [["Accept", "*/*"]],
        }),
        http_grant(&base, token.path()),
    )
    .await;
    let instance = provider.create(spec()).await.unwrap();
    assert_eq!(instance.message.as_deref(), Some("HTTP 200"));
    let seen = seen.lock().unwrap();
    let host = base.trim_start_matches("http://");
    assert_eq!(
        *seen,
        [(
            "GET".to_string(),
            host.to_string(),
            "Bearer s3cret".to_string()
        )]
    );
}

/// The http grant of the loopback server with SigV4 signing from static keys in `dir`.
fn aws_grant(base: &str, dir: &std::path::Path) -> Grants {
    std::fs::write(dir.join("id"), "AKIDHOSTILETEST").unwrap();
    std::fs::write(dir.join("secret"), "hostile-secret-key").unwrap();
    serde_json::from_value(serde_json::json!({
        "http": {
            "allow": [base],
            "credentials": [{
                "url": base,
                "valueFrom": {"awsCredentials": {
                    "region": "eu-west-1",
                    "accessKeyIdFrom": {"file": dir.join("id")},
                    "secretAccessKeyFrom": {"file": dir.join("secret")},
                }},
            }],
        }
    }))
    .unwrap()
}

/// A plugin cannot shape the SigV4 signature: what the signing sets (or a presigned URL's
/// parameters) is refused before anything leaves the host.
#[rstest]
#[case::its_own_authorization(&[("Authorization", "AWS4-HMAC-SHA256 Credential=AKIDOTHER/x")], "/x", "header `authorization`")]
#[case::a_date_to_replay(&[("X-Amz-Date", "20200101T000000Z")], "/x", "header `x-amz-date`")]
#[case::a_session_token(&[("X-Amz-Security-Token", "stolen")], "/x", "header `x-amz-security-token`")]
#[case::a_payload_hash(&[("x-amz-content-sha256", "UNSIGNED-PAYLOAD")], "/x", "header `x-amz-content-sha256`")]
#[case::a_presigned_query(&[], "/x?X-Amz-Signature=abc&X-Amz-Credential=AKIDOTHER", "query parameter `X-Amz-Signature`")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_cannot_shape_the_sigv4_signature(
    #[case] headers: &[(&str, &str)],
    #[case] path: &str,
    #[case] says: &str,
) {
    let (base, seen) = recording_server().await;
    let dir = tempfile::tempdir().unwrap();
    let provider = hostile_with(
        serde_json::json!({
            "attempt": "http", "method": "POST", "url": format!("{base}{path}"), "headers": headers,
        }),
        aws_grant(&base, dir.path()),
    )
    .await;
    refused_before_sending(&provider, &seen, says).await;
}

/// Without the forbidden part the request goes out signed; `X-Amz-Target` (the operation of
/// AWS's JSON APIs) is the plugin's to set, and is signed with the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordinary_request_to_an_aws_grant_is_signed() {
    let (base, seen) = recording_server().await;
    let dir = tempfile::tempdir().unwrap();
    let provider = hostile_with(
        serde_json::json!({
            "attempt": "http", "method": "POST", "url": format!("{base}/"),
            "headers": [["X-Amz-Target", "AmazonEC2.DescribeInstances"]],
        }),
        aws_grant(&base, dir.path()),
    )
    .await;
    let instance = provider.create(spec()).await.unwrap();
    assert_eq!(instance.message.as_deref(), Some("HTTP 200"));
    let seen = seen.lock().unwrap();
    let authorization = &seen[0].2;
    assert!(
        authorization.starts_with("AWS4-HMAC-SHA256 Credential=AKIDHOSTILETEST/")
            && authorization.contains("/eu-west-1/ec2/aws4_request, SignedHeaders=host;x-amz-date;x-amz-target, Signature="),
        "{authorization}"
    );
}

/// `size` zero bytes, gzipped (a few hundred KiB for hundreds of MiB).
fn gzip_bomb(size: u64) -> Vec<u8> {
    use std::io::Read;
    // Best compression: zeros shrink ~1000 times, so the bomb fits a ConfigMap (1 MiB).
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    std::io::copy(&mut std::io::repeat(0).take(size), &mut encoder).unwrap();
    encoder.finish().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzip_bomb_in_the_plugins_configmap_is_refused() {
    use proxy_operator::provider::registry::{
        Change, PackedPlugin, PluginRegistry, RegistryMetrics, RegistryOptions,
    };
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("providers.yaml");
    std::fs::write(&config, "providers:\n- {name: bombed, type: bomb}\n").unwrap();
    let (engine, _) = engine_with(test_options()).await;
    let registry = PluginRegistry::start(
        engine,
        RegistryOptions {
            plugins_dir: dir.path().to_path_buf(),
            configmap: Some(("proxy-operator".into(), "plugins".into())),
            download_dir: None,
        },
        &config,
        None,
        RegistryMetrics::unregistered().unwrap(),
    )
    .await
    .unwrap();
    // 300 MiB of zeros: over the 256 MiB bound once inflated.
    let bomb = gzip_bomb(300 << 20);
    assert!(bomb.len() < 1 << 20, "{} bytes", bomb.len());
    // Under a key no provider instance names, it is never inflated: `bombed` is still only
    // missing its plugin.
    let unused = std::collections::BTreeMap::from([(
        "unused".to_string(),
        PackedPlugin::gzipped(bomb.clone()),
    )]);
    for change in registry.apply_configmap(unused).await {
        let Change::Refused { reason, .. } = &change else {
            panic!("{change:?}")
        };
        assert!(reason.contains("no plugin `bomb`"), "{reason}");
    }
    // Under the key of a provider instance, inflating stops at the bound and says so.
    let used =
        std::collections::BTreeMap::from([("bomb".to_string(), PackedPlugin::gzipped(bomb))]);
    let changes = registry.apply_configmap(used).await;
    let [
        Change::Refused {
            provider,
            reason,
            from_configmap,
            ..
        },
    ] = changes.as_slice()
    else {
        panic!("{changes:?}")
    };
    assert_eq!(provider, "bombed");
    assert!(*from_configmap);
    assert!(
        reason.contains("larger than 256 MiB decompressed"),
        "{reason}"
    );
    let providers = registry.providers().current();
    assert!(providers.get("bombed").is_none());
    assert!(
        providers
            .not_loaded("bombed")
            .unwrap()
            .reason
            .contains("256 MiB")
    );
}

/// The hostile plugin declares `log` and `http` only: its calls into `kube` and `libvirt` are
/// refused even where its provider instance is granted them.
#[rstest]
#[case::kube_granted_but_undeclared(
    "undeclared-kube",
    serde_json::json!({"kube": {"namespace": "proxies", "kinds": ["v1/ConfigMap"]}}),
    "does not declare the `kube` capability"
)]
#[case::libvirt_granted_but_undeclared(
    "undeclared-libvirt",
    serde_json::json!({"libvirt": {"hosts": [{"name": "hv1", "address": "127.0.0.1", "user": "virt", "pools": ["default"]}]}}),
    "does not declare the `libvirt` capability"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_into_undeclared_capabilities_are_refused(
    #[case] attempt: &str,
    #[case] grants: serde_json::Value,
    #[case] says: &str,
) {
    let grants: Grants = serde_json::from_value(grants).unwrap();
    let provider = hostile_with(serde_json::json!({ "attempt": attempt }), grants).await;
    let ProviderError::Denied(message) = provider_error(provider.create(spec()).await) else {
        panic!()
    };
    assert!(message.contains(says), "{message}");
}

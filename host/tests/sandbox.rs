//! The sandbox against a hostile plugin (`plugins/hostile-provider`), through the real runtime:
//! each attempt is a named case that asserts the host's bound held.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proxy_operator::capabilities::Grants;
use proxy_operator::capabilities::log::LOG_BURST;
use proxy_operator::plugins::bounds::{MAX_CHECK_TARGETS, MAX_LIST_INSTANCES, MAX_MESSAGE_BYTES};
use proxy_operator::plugins::types::{InstanceSpec, Owner, ProviderError};
use proxy_operator::plugins::{CallError, ProviderInstance, ProviderInstanceOptions};
use rstest::rstest;

use common::{engine_with, plugin_bytes, test_options};

/// The hostile provider bound to `attempt` (and its size `n`).
async fn hostile(attempt: &str, n: u64) -> ProviderInstance {
    let (engine, _) = engine_with(test_options()).await;
    let plugin = engine
        .load("hostile.wasm", plugin_bytes("hostile"))
        .await
        .expect("the hostile plugin loads");
    ProviderInstance::new(
        engine,
        "hostile-test",
        plugin,
        &serde_json::json!({ "attempt": attempt, "n": n }),
        &Grants::default().validate().unwrap(),
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

//! What reaches the status of an instance still provisioning.

use rstest::rstest;

use super::observed;
use crate::api::{Proxy, ProxyStatus};
use crate::provider::plugins::types::{Instance, InstanceState};

fn proxy() -> Proxy {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "proxy-operator.dev/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": "egress-1", "namespace": "crawlers", "uid": "u-1", "generation": 1},
        "spec": {"provider": "kvm-home"},
    }))
    .unwrap()
}

fn waiting(message: Option<&str>) -> Instance {
    Instance {
        provider_id: "vm-1".into(),
        name: "px-1".into(),
        state: InstanceState::Provisioning,
        address: None,
        port: 3128,
        zone: None,
        created_at: None,
        owner: None,
        message: message.map(String::from),
    }
}

/// The provider's message on an instance still provisioning (the kvm provider's "waiting for
/// the guest agent", and after 5 minutes what to check) reaches the condition, not only its log.
#[rstest]
#[case::with_the_providers_words(
    Some("running; waiting for the guest agent to report an IPv4 address"),
    "instance vm-1 is Provisioning, waiting for an address: running; waiting for the guest agent to report an IPv4 address"
)]
#[case::without(None, "instance vm-1 is Provisioning, waiting for an address")]
#[case::blank(Some("  "), "instance vm-1 is Provisioning, waiting for an address")]
fn a_provisioning_instance_s_message_is_in_its_condition(
    #[case] said: Option<&str>,
    #[case] expected: &str,
) {
    let effects = observed(&proxy(), ProxyStatus::default(), &waiting(said), true);
    let provisioned = effects
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == "Provisioned")
        .unwrap();
    assert_eq!(provisioned.reason, "Provisioning");
    assert_eq!(provisioned.message, expected);
}

use rstest::rstest;
use serde_json::json;

use super::*;

const NOW: u64 = 1_800_000_000_000;
const T: &str = "2027-01-15T08:00:00Z";

fn cond(type_: &str, status: &str, reason: &str, message: &str) -> serde_json::Value {
    json!({"type": type_, "status": status, "reason": reason, "message": message,
           "lastTransitionTime": T})
}

fn proxy(status: serde_json::Value) -> Proxy {
    serde_json::from_value(json!({
        "apiVersion": "proxy-operator.dev/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": "p", "namespace": "crawl"},
        "spec": {"provider": "store", "port": 3128},
        "status": status,
    }))
    .unwrap()
}

fn not_provisioned(phase: &str, reason: &str, message: &str) -> serde_json::Value {
    json!({"phase": phase, "lastError": message, "conditions": [
        cond("Provisioned", "False", reason, message),
        cond("Ready", "False", reason, message)]})
}

fn provisioned(healthy: Option<(&str, &str)>) -> serde_json::Value {
    let mut conditions = vec![cond(
        "Provisioned",
        "True",
        "InstanceRunning",
        "instance i-1 running at 127.0.0.1:3128",
    )];
    let phase = match healthy {
        Some(("False", message)) => {
            conditions.push(cond("Healthy", "False", "ProbeFailed", message));
            conditions.push(cond("Ready", "False", "Unhealthy", message));
            "Unhealthy"
        }
        Some((_, message)) => {
            conditions.push(cond("Healthy", "True", "ProbeSucceeded", message));
            conditions.push(cond(
                "Ready",
                "True",
                "Healthy",
                "provisioned and passing health probes",
            ));
            "Ready"
        }
        None => {
            conditions.push(cond(
                "Ready",
                "True",
                "InstanceRunning",
                "provisioned; not yet judged by health probes",
            ));
            "Ready"
        }
    };
    json!({"phase": phase, "providerID": "i-1", "address": "127.0.0.1", "port": 3128,
           "conditions": conditions})
}

fn health(ready: bool, reason: &str) -> ProviderHealth {
    serde_json::from_value(json!({
        "apiVersion": "proxy-operator.dev/v1alpha1", "kind": "ProviderHealth",
        "metadata": {"name": "store"}, "spec": {"providerType": "test"},
        "status": {"conditions": [
            cond("Ready", if ready {"True"} else {"False"}, reason, "1 of 1 targets failing; store: full"),
            cond("PluginLoaded", "True", "Loaded", "test 0.1.0 (sha256 0a1b2c3d4e5f)")]},
    }))
    .unwrap()
}

/// Each way a Proxy is stuck, by what the operator wrote: the step that fails first, what it
/// means, and the entry of docs/troubleshooting.md.
#[rstest]
#[case::unknown_provider(
    not_provisioned(
        "Pending",
        "UnknownProvider",
        "no provider instance `store` in the providers config (configured: a, b); add `store` to the providers config, or recreate the Proxy with another spec.provider (it is immutable)"
    ),
    "provider",
    "its provider is not in the operator's providers config",
    Some(UNKNOWN_PROVIDER)
)]
#[case::access_denied(
    not_provisioned(
        "Pending",
        "AccessDenied",
        "spec.cloudInit: provider instance `store` does not allow user cloud-init (access.allow.userData is false); remove it, or ask the platform team to set access.allow.userData"
    ),
    "provider",
    "its provider instance's access (providers config) refuses it",
    Some(ACCESS_DENIED)
)]
#[case::plugin_refused_the_config(
    json!({"phase": "Pending",
           "lastError": "the `late` plugin of provider instance `store` is not loaded: the new plugin version rejected the config: providers[0] (store): the `late` plugin rejected its config: config.endpoint: `gopher://x` must start with http://",
           "conditions": [cond("Provisioned", "False", "PluginNotLoaded", "the `late` plugin of provider instance `store` is not loaded: no plugin `late`"),
                          cond("Ready", "False", "PluginNotLoaded", "…")]}),
    "plugin", "the provider's plugin refused the provider instance's config", Some(PLUGIN_NOT_LOADED))]
#[case::plugin_missing(
    not_provisioned(
        "Pending",
        "PluginNotLoaded",
        "the `late` plugin of provider instance `store` is not loaded: no plugin `late` in the plugins directory or ConfigMap"
    ),
    "plugin",
    "the provider's plugin is not loaded",
    Some(PLUGIN_NOT_LOADED)
)]
#[case::quota(
    not_provisioned(
        "Pending",
        "Quota",
        "Create at provider store: quota: HTTP 429: the store is full; retrying"
    ),
    "instance",
    "the provider is out of capacity (a quota)",
    Some(QUOTA_OR_RETRYING)
)]
#[case::retrying(
    not_provisioned(
        "Pending",
        "Retrying",
        "Create at provider store: HTTP 503: busy; retrying"
    ),
    "instance",
    "the provider's last create failed and is being retried",
    Some(QUOTA_OR_RETRYING)
)]
#[case::a_zone_not_searched(
    not_provisioned(
        "Pending",
        "Retrying",
        "Create at provider g: zone europe-west1-c could not be searched for an existing instance px-1 (timeout); retrying"
    ),
    "instance",
    "the provider cannot search a zone or host",
    Some(NOT_SEARCHED)
)]
#[case::unauthorized(
    not_provisioned(
        "Failed",
        "Unauthorized",
        "Create failed at provider store: HTTP 401: who are you"
    ),
    "instance",
    "outside the Proxy (credentials, grants or config)",
    Some(OUTSIDE_THE_SPEC)
)]
#[case::permanent(
    not_provisioned(
        "Failed",
        "ProviderError",
        "Create failed at provider store: no such image"
    ),
    "instance",
    "a permanent error",
    None
)]
#[case::gcp_insert(
    not_provisioned(
        "Failed",
        "ProviderError",
        "Create failed at provider g: the insert operation op-1 failed: RESOURCE_NOT_FOUND: image"
    ),
    "instance",
    "a permanent error",
    Some(GCP_INSERT)
)]
#[case::lost(
    not_provisioned(
        "Failed",
        "InstanceLost",
        "instance i-1 no longer exists at provider store: gone"
    ),
    "instance",
    "no longer exists at the provider",
    Some(INSTANCE_LOST)
)]
#[case::no_address_from_the_guest_agent(
    json!({"phase": "Provisioning", "providerID": "vm-1", "conditions": [
        cond("Provisioned", "False", "Provisioning", "instance vm-1 is Provisioning, waiting for an address: running; waiting for the guest agent to report an IPv4 address"),
        cond("Ready", "False", "Provisioning", "…")]}),
    "address", "the instance exists but has no address yet", Some(PROVISIONING))]
#[case::refused_by_squid(
    provisioned(Some(("False", "2 consecutive probes failed; last: the proxy answered CONNECT with HTTP 403: the proxy refused the request; usually …"))),
    "probes", "squid refused the health probe (HTTP 403)", Some(NEVER_READY))]
#[case::credentials(
    provisioned(Some(("False", "3 consecutive probes failed; last: the proxy answered CONNECT with HTTP 407: the proxy did not accept its credentials"))),
    "probes", "(HTTP 407)", Some(CREDENTIALS_407))]
#[case::not_listening(
    provisioned(Some(("False", "3 consecutive probes failed; last: cannot connect to the proxy: Connection refused (os error 111)"))),
    "probes", "nothing answers CONNECT", Some(NEVER_READY))]
#[case::unreachable_target(
    provisioned(Some(("False", "3 consecutive probes failed; last: the proxy answered CONNECT with HTTP 503"))),
    "probes", "could not reach the health target", Some(NEVER_READY))]
#[case::never_looked_at(json!(null), "operator", "has not written a status", Some(NOT_LEADER))]
fn the_first_failing_step_is_the_cause(
    #[case] status: serde_json::Value,
    #[case] step: &str,
    #[case] summary: &str,
    #[case] anchor: Option<&str>,
) {
    let explanation = explain(
        &proxy(status),
        Some(&health(true, "Ok")),
        Vec::new(),
        &Leasing::default(),
        NOW,
    );
    assert!(!explanation.ready);
    let cause = explanation.cause.as_ref().expect("a cause");
    assert_eq!(cause.step, step, "{explanation:#?}");
    assert!(cause.summary.contains(summary), "{}", cause.summary);
    assert_eq!(cause.see, anchor.map(|a| format!("{TROUBLESHOOTING}#{a}")));
    assert!(!cause.message.is_empty() && !cause.advice.is_empty());
    // The steps before it passed, the ones after were not reached.
    let failed = explanation
        .steps
        .iter()
        .position(|s| s.state == StepState::Failed)
        .unwrap();
    assert_eq!(explanation.steps[failed].step, step);
    assert!(
        explanation.steps[..failed]
            .iter()
            .all(|s| s.state == StepState::Ok),
        "{explanation:#?}"
    );
    assert!(
        explanation.steps[failed + 1..]
            .iter()
            .all(|s| s.state == StepState::NotReached)
    );
}

#[test]
fn a_ready_proxy_says_whether_it_can_be_leased() {
    let ready = proxy(provisioned(Some((
        "True",
        "CONNECT 127.0.0.1:80 through the proxy succeeded in 3 ms",
    ))));
    let free = explain(&ready, None, Vec::new(), &Leasing::default(), NOW);
    assert!(free.ready && free.cause.is_none());
    assert!(
        free.steps.iter().all(|s| s.state == StepState::Ok),
        "{free:#?}"
    );
    assert_eq!(
        free.leasing.as_deref(),
        Some("it is free: crawlers can lease it")
    );
    let draining = Leasing {
        draining: true,
        ..Default::default()
    };
    assert!(
        explain(&ready, None, Vec::new(), &draining, NOW)
            .leasing
            .unwrap()
            .starts_with("it is draining")
    );
    let leased = Leasing {
        holder: Some("static token".into()),
        leased_until_ms: Some(NOW + 240_000),
        ..Default::default()
    };
    assert_eq!(
        explain(&ready, None, Vec::new(), &leased, NOW)
            .leasing
            .as_deref(),
        Some("it is leased by static token until in 4m")
    );
    let unjudged = proxy(provisioned(None));
    let explanation = explain(&unjudged, None, Vec::new(), &Leasing::default(), NOW);
    assert!(explanation.ready);
    let probes = explanation
        .steps
        .iter()
        .find(|s| s.step == "probes")
        .unwrap();
    assert_eq!(probes.says, "provisioned; not yet judged by health probes");
}

/// A failing provider check is shown, not taken for the cause: a quota answer is the cause.
#[test]
fn a_failing_provider_check_is_a_warning_beside_the_cause() {
    let stuck = proxy(not_provisioned(
        "Pending",
        "Quota",
        "Create at provider store: quota: HTTP 429: full; retrying",
    ));
    let explanation = explain(
        &stuck,
        Some(&health(false, "QuotaExceeded")),
        Vec::new(),
        &Leasing::default(),
        NOW,
    );
    let check = explanation
        .steps
        .iter()
        .find(|s| s.step == "provider check")
        .unwrap();
    assert_eq!(check.state, StepState::Warning);
    assert!(
        check.says.starts_with("ProviderHealth QuotaExceeded: "),
        "{}",
        check.says
    );
    assert_eq!(explanation.cause.unwrap().step, "instance");
    let plugin = explanation
        .steps
        .iter()
        .find(|s| s.step == "plugin")
        .unwrap();
    assert_eq!(plugin.says, "plugin test 0.1.0 (sha256 0a1b2c3d4e5f)");
}

#[test]
fn the_explanation_reads_as_steps_then_why_do_see() {
    let stuck = proxy(not_provisioned(
        "Pending",
        "Quota",
        "Create at provider store: quota: HTTP 429: full; retrying",
    ));
    let events = vec![EventLine {
        type_: "Warning".into(),
        reason: "Quota".into(),
        message: "Create at provider store: quota: HTTP 429: full; retrying".into(),
        count: 3,
        at_ms: Some(NOW - 30_000),
        at: None,
    }];
    let text = render(
        &explain(&stuck, None, events, &Leasing::default(), NOW),
        NOW,
        false,
    );
    let expected = "\
crawl/p is not Ready (phase Pending).

  ✓ operator        seen by the operator: phase Pending
  ✓ provider        provider instance `store` is configured
  ✓ plugin          its plugin is loaded
  ✓ provider check  no ProviderHealth yet (checked every --provider-check-interval)
  ✗ instance        Create at provider store: quota: HTTP 429: full; retrying
  · address         not reached
  · probes          not reached
  · ready           not reached

Why:  the provider is out of capacity (a quota)
Do:   Raise the quota or free capacity at the provider (delete Proxies it no longer needs); the operator tries again every minute, and the Proxy goes on without a change to it.
See:  docs/troubleshooting.md#a-proxy-stays-pending-with-reason-quota-or-retrying

Recent events:
  30s ago Warning Quota (x3): Create at provider store: quota: HTTP 429: full; retrying
";
    assert_eq!(text, expected, "\n{text}");
}

/// GitHub's anchor of a heading: lower case, spaces to hyphens, other punctuation dropped.
fn anchor_of(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c.to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

/// Every entry `why` points at is a heading of docs/troubleshooting.md.
#[test]
fn every_anchor_is_an_entry_of_the_troubleshooting_guide() {
    let guide = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/troubleshooting.md"),
    )
    .unwrap();
    let anchors: Vec<String> = guide
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(anchor_of)
        .collect();
    assert_eq!(
        anchor_of(
            "Crawlers get `407 Proxy Authentication Required`, or a Proxy's probes fail with `HTTP 407`"
        ),
        CREDENTIALS_407
    );
    for anchor in ANCHORS {
        assert!(
            anchors.iter().any(|a| a == anchor),
            "no heading for #{anchor} in {anchors:#?}"
        );
    }
}

/// What a plugin says reaches the reader without its control sequences (docs/security.md,
/// "What a reader is shown"): in the steps and the events, coloured or not.
#[test]
fn a_plugins_control_sequences_never_reach_the_terminal() {
    let hostile = "quota\x1b]52;c;Y3VybCBldmlsLnNo\x07 full\u{9b}2J\r\x1b[1Aok";
    let stuck = proxy(not_provisioned("Pending", "Quota", hostile));
    let events = vec![EventLine {
        type_: "Warning\x1b[8m".into(),
        reason: "Quota\u{202e}".into(),
        message: hostile.into(),
        count: 1,
        at_ms: Some(NOW - 30_000),
        at: None,
    }];
    let explanation = explain(&stuck, None, events, &Leasing::default(), NOW);
    for colour in [false, true] {
        let text = crate::faces::kubectl::describe::tests::without_own_colours(&render(
            &explanation,
            NOW,
            colour,
        ));
        assert!(!text.contains("52;c;"), "{text:?}");
        assert!(
            !text
                .chars()
                .any(|c| c.is_control() && c != '\n' || c == '\u{202e}'),
            "{text:?}"
        );
        assert!(text.contains("quota full ok"), "{text:?}");
    }
}

use super::*;
use rstest::rstest;

/// The rules of instance `kvm` with this `access` (its kube grant namespace: `platform`); none
/// without.
fn rules(access: &str) -> Option<Rules> {
    if access.is_empty() {
        return None;
    }
    let access: Access = crate::support::yaml::from_str(access).unwrap();
    access.validate(Some("platform")).unwrap();
    Some(access.rules("kvm", Some("platform")))
}

fn spec(json: &str) -> ProxySpec {
    serde_json::from_str(json).unwrap()
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

const LISTED: &str = "{namespaces: [team-a]}";
const SELECTED: &str = "{namespaceSelector: {matchLabels: {proxy-operator.dev/tenant: 'true'}}}";
const EVERYWHERE: &str = "{namespaceSelector: {}}";
const GENEROUS: &str = "{namespaces: [team-a], allow: {userData: true, vendorData: true, unmanagedSquid: true, serviceTypes: [ClusterIP, LoadBalancer]}}";

/// Every (access, namespace, spec) combination: `None` is allowed, else the refused field.
#[rstest]
#[case::no_access_anything_anywhere("", "team-z", &[], r#"{"provider":"kvm","cloudInit":"x","vendorData":"y","providerOptions":{"managedSquid":false,"serviceType":"LoadBalancer"}}"#, None)]
#[case::listed_namespace(LISTED, "team-a", &[], r#"{"provider":"kvm"}"#, None)]
#[case::grant_namespace(LISTED, "platform", &[], r#"{"provider":"kvm"}"#, None)]
#[case::unlisted_namespace(LISTED, "team-b", &[], r#"{"provider":"kvm"}"#, Some("spec.provider"))]
#[case::selected_namespace(SELECTED, "team-b", &[("proxy-operator.dev/tenant", "true")], r#"{"provider":"kvm"}"#, None)]
#[case::selector_other_value(SELECTED, "team-b", &[("proxy-operator.dev/tenant", "false")], r#"{"provider":"kvm"}"#, Some("spec.provider"))]
#[case::selector_no_labels(SELECTED, "team-b", &[], r#"{"provider":"kvm"}"#, Some("spec.provider"))]
#[case::empty_selector_every_namespace(EVERYWHERE, "team-z", &[], r#"{"provider":"kvm"}"#, None)]
#[case::user_data_default_denied(LISTED, "team-a", &[], r#"{"provider":"kvm","cloudInit":"x"}"#, Some("spec.cloudInit"))]
#[case::user_data_allowed(GENEROUS, "team-a", &[], r#"{"provider":"kvm","cloudInit":"x"}"#, None)]
#[case::vendor_data_default_denied(LISTED, "team-a", &[], r#"{"provider":"kvm","vendorData":"x"}"#, Some("spec.vendorData"))]
#[case::vendor_data_allowed(GENEROUS, "team-a", &[], r#"{"provider":"kvm","vendorData":"x"}"#, None)]
#[case::unmanaged_squid_denied(LISTED, "team-a", &[], r#"{"provider":"kvm","providerOptions":{"managedSquid":false}}"#, Some("spec.providerOptions.managedSquid"))]
#[case::not_a_boolean_is_not_managed(LISTED, "team-a", &[], r#"{"provider":"kvm","providerOptions":{"managedSquid":"no"}}"#, Some("spec.providerOptions.managedSquid"))]
#[case::managed_squid_said(LISTED, "team-a", &[], r#"{"provider":"kvm","providerOptions":{"managedSquid":true}}"#, None)]
#[case::unmanaged_squid_allowed(GENEROUS, "team-a", &[], r#"{"provider":"kvm","providerOptions":{"managedSquid":false}}"#, None)]
#[case::cluster_ip_by_default(LISTED, "team-a", &[], r#"{"provider":"kvm","providerOptions":{"serviceType":"ClusterIP"}}"#, None)]
#[case::load_balancer_denied(LISTED, "team-a", &[], r#"{"provider":"kvm","providerOptions":{"serviceType":"LoadBalancer"}}"#, Some("spec.providerOptions.serviceType"))]
#[case::load_balancer_allowed(GENEROUS, "team-a", &[], r#"{"provider":"kvm","providerOptions":{"serviceType":"LoadBalancer"}}"#, None)]
#[case::node_port_not_listed(GENEROUS, "team-a", &[], r#"{"provider":"kvm","providerOptions":{"serviceType":"NodePort"}}"#, Some("spec.providerOptions.serviceType"))]
#[case::namespace_first(LISTED, "team-b", &[], r#"{"provider":"kvm","cloudInit":"x"}"#, Some("spec.provider"))]
fn each_combination_is_decided(
    #[case] access: &str,
    #[case] namespace: &str,
    #[case] namespace_labels: &[(&str, &str)],
    #[case] proxy: &str,
    #[case] refused: Option<&str>,
) {
    let rules = rules(access);
    let decided = check(
        rules.as_ref(),
        namespace,
        &labels(namespace_labels),
        "spec.provider",
        "spec.",
        &spec(proxy),
    );
    assert_eq!(
        decided.as_ref().err().map(|r| r.field.as_str()),
        refused,
        "{decided:?}"
    );
    if let Err(refusal) = decided {
        let message = refusal.to_string();
        assert!(message.contains("`kvm`"), "names the instance: {message}");
        assert!(
            message.contains("ask the platform team"),
            "the fix: {message}"
        );
    }
}

#[test]
fn a_refusal_names_the_field_the_rule_and_the_fix() {
    let rules = rules(LISTED);
    let refusal = check(
        rules.as_ref(),
        "team-b",
        &BTreeMap::new(),
        "spec.provider",
        "spec.",
        &spec(r#"{"provider":"kvm"}"#),
    )
    .unwrap_err();
    assert_eq!(
        refusal.to_string(),
        "spec.provider: namespace `team-b` may not use provider instance `kvm` (its access allows namespaces [platform, team-a]); use a provider instance your namespace may use, or ask the platform team to add the namespace to its access in the providers config"
    );
}

fn pool(json: &str) -> ProxyPoolSpec {
    serde_json::from_str(json).unwrap()
}

#[rstest]
#[case::within_the_limit(
    r#"{"replicas":3,"template":{"spec":{"provider":"kvm"}}}"#,
    "team-a",
    None
)]
#[case::over_the_limit(
    r#"{"replicas":4,"template":{"spec":{"provider":"kvm"}}}"#,
    "team-a",
    Some("spec.replicas")
)]
#[case::template_field(
    r#"{"replicas":1,"template":{"spec":{"provider":"kvm","cloudInit":"x"}}}"#,
    "team-a",
    Some("spec.template.spec.cloudInit")
)]
#[case::other_namespace(
    r#"{"replicas":1,"template":{"spec":{"provider":"kvm"}}}"#,
    "team-b",
    Some("spec.template.spec.provider")
)]
#[case::spread_names_it(r#"{"replicas":1,"template":{"spec":{"provider":"open"}},"spread":[{"provider":"open"},{"provider":"kvm"}]}"#, "team-b", Some("spec.spread[1].provider"))]
#[case::open_instance_anywhere(
    r#"{"replicas":500,"template":{"spec":{"provider":"open","cloudInit":"x"}}}"#,
    "team-b",
    None
)]
fn a_pool_is_checked_for_every_instance_it_names(
    #[case] json: &str,
    #[case] namespace: &str,
    #[case] refused: Option<&str>,
) {
    let limited = rules("{namespaces: [team-a], allow: {maxPoolReplicas: 3}}").unwrap();
    let rules_of = |name: &str| (name == "kvm").then_some(&limited);
    let decided = check_pool(rules_of, namespace, &BTreeMap::new(), &pool(json));
    assert_eq!(
        decided.as_ref().err().map(|r| r.field.as_str()),
        refused,
        "{decided:?}"
    );
}

#[test]
fn an_access_naming_no_namespace_says_how_to_name_one() {
    let access = Access::default();
    let message = access.validate(None).unwrap_err();
    assert!(
        message.starts_with(
            "access: no namespace may use this instance; list them in access.namespaces"
        ),
        "{message}"
    );
    // With a kube grant, its namespace is the default.
    assert_eq!(access.validate(Some("platform")), Ok(()));
    let rules = access.rules("kvm", Some("platform"));
    assert_eq!(
        rules.namespaces.into_iter().collect::<Vec<_>>(),
        ["platform"]
    );
}

#[test]
fn the_safe_defaults_hold_when_allow_is_absent() {
    let rules = rules(LISTED).unwrap();
    assert_eq!(rules.allow, Allow::default());
    assert_eq!(rules.allow.service_types, ["ClusterIP"]);
    assert!(!rules.allow.user_data && !rules.allow.vendor_data && !rules.allow.unmanaged_squid);
}

#[test]
fn the_policy_has_a_validation_per_rule_and_none_without_access() {
    assert!(policy::manifests("p", &[]).is_none());
    let rules = vec![
        rules("{namespaces: [team-a], namespaceSelector: {matchLabels: {tier: gold}}, allow: {maxPoolReplicas: 5}}")
            .unwrap(),
    ];
    let (vap, binding) = policy::manifests("op-provider-access", &rules).unwrap();
    assert_eq!(binding["spec"]["policyName"], "op-provider-access");
    assert_eq!(binding["spec"]["validationActions"][0], "Deny");
    let validations = vap["spec"]["validations"].as_array().unwrap();
    // Proxy: namespace, cloudInit, vendorData, managedSquid, serviceType; pool: those + replicas.
    assert_eq!(validations.len(), 11);
    let first = validations[0]["expression"].as_str().unwrap();
    assert_eq!(
        first,
        "request.resource.resource != 'proxies' || !(object.spec.provider == 'kvm') || (request.namespace in ['platform', 'team-a'] || (has(namespaceObject.metadata.labels) && 'tier' in namespaceObject.metadata.labels && namespaceObject.metadata.labels['tier'] == 'gold'))"
    );
    assert!(
        validations[0]["message"]
            .as_str()
            .unwrap()
            .starts_with("spec.provider: this namespace may not use provider instance `kvm`")
    );
    assert!(validations.iter().any(|v| {
        v["expression"]
            .as_str()
            .unwrap()
            .ends_with("(object.spec.replicas <= 5)")
    }));
}

//! Provider access (docs/tenancy.md, "Which teams may use a provider instance"): an instance
//! whose `access` allows only team A's namespace and no user cloud-init. Refused at `kubectl
//! apply` by the admission policy the operator generates; refused again by the controller (a
//! condition, no instance) once that policy is gone; an allowed Proxy still made.

use super::*;
use proxy_operator::api::ProxyPool;
use proxy_operator::leasing::leases::{LeaseMetrics, LeaseOptions, LeaseStore};
use proxy_operator::lifecycle::access::write_policy;
use proxy_operator::provider::access::policy;

/// A Proxy without user cloud-init (the allowed kind).
fn plain_proxy(ns: &str, name: &str, provider: &str) -> String {
    format!(
        "apiVersion: proxy-operator.dev/v1alpha1\nkind: Proxy\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {{provider: {provider}, placement: {{zone: zone-a}}}}\n"
    )
}

/// `kubectl apply` of `yaml`; the error text when the API server refuses it.
async fn apply(cp: &ControlPlane, yaml: &str, dry_run: bool) -> Result<String, String> {
    let mut args = vec!["apply", "-f", "-"];
    if dry_run {
        args.push("--dry-run=server");
    }
    cp.kubectl_run(&args, Some(yaml))
        .await
        .map_err(|e| format!("{e:#}"))
}

/// Waits until a server-side dry run of `yaml` is refused (`refused`) or admitted: the API
/// server takes a moment to start or stop enforcing a new or deleted policy.
async fn await_admission(cp: &ControlPlane, yaml: &str, refused: bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let outcome = apply(cp, yaml, true).await;
        if outcome.is_err() == refused {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "admission never changed to refused={refused}: {outcome:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn condition<'a>(proxy: Option<&'a Proxy>, type_: &str) -> Option<(&'a str, &'a str, &'a str)> {
    let status = proxy?.status.as_ref()?;
    let c = status.conditions.iter().find(|c| c.type_ == type_)?;
    Some((c.status.as_str(), c.reason.as_str(), c.message.as_str()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_only_team_a_may_use_refuses_at_apply_and_in_the_controller() {
    let cp = control_plane().await;
    let team_a = cp.namespace("access-a").await.unwrap();
    let team_b = cp.namespace("access-b").await.unwrap();
    let (a, b) = (team_a.name(), team_b.name());
    let store = InstanceStore::start().await;
    // An instance name of its own: the policy is cluster-wide, and other tests' `store` stays
    // open to every namespace. The selector makes the controller read namespace labels (RBAC).
    let provider = format!("acc-{}", a.trim_start_matches("access-a-"));
    let config = format!(
        "providers:\n{}  access: {{namespaces: [{a}], namespaceSelector: {{matchLabels: {{proxy-operator.test/{provider}: 'true'}}}}, allow: {{userData: false, maxPoolReplicas: 2}}}}\n",
        store_provider(&provider, &store)
    );
    let providers =
        proxy_operator::provider::providers::ProviderSet::new(providers_for(&config).await);
    let name = policy::name(&provider);
    let admin = cp.client();
    write_policy(&admin, &name, &providers.current().access_rules())
        .await
        .unwrap();
    // As the operator runs them: its ServiceAccount's RBAC (deploy/rbac.yaml) applies.
    let _a = Operator::with_providers(operator_account(cp), &team_a, providers.clone());
    let _b = Operator::with_providers(operator_account(cp), &team_b, providers.clone());

    // At apply: team B may not use the instance at all, team A not with user cloud-init.
    let in_b = proxy_yaml(b, "in-b", &provider, "");
    await_admission(cp, &in_b, true).await;
    let refused = apply(cp, &in_b, false).await.unwrap_err();
    assert!(
        refused.contains(&format!(
            "spec.provider: this namespace may not use provider instance `{provider}` (its access in the providers config allows namespaces [{a}]"
        )),
        "{refused}"
    );
    let with_user_data = proxy_yaml(a, "with-user-data", &provider, "");
    let refused = apply(cp, &with_user_data, false).await.unwrap_err();
    assert!(
        refused.contains(&format!(
            "spec.cloudInit: provider instance `{provider}` does not allow user cloud-init (access.allow.userData is false)"
        )),
        "{refused}"
    );
    let big_pool = format!(
        "apiVersion: proxy-operator.dev/v1alpha1\nkind: ProxyPool\nmetadata: {{name: big, namespace: {a}}}\nspec: {{replicas: 3, template: {{spec: {{provider: {provider}}}}}}}\n"
    );
    let refused = apply(cp, &big_pool, false).await.unwrap_err();
    assert!(
        refused.contains("spec.replicas: provider instance") && refused.contains("at most 2"),
        "{refused}"
    );

    // An allowed Proxy in A is made and becomes Ready.
    let api_a: Api<Proxy> = team_a.api();
    apply(cp, &plain_proxy(a, "allowed", &provider), false)
        .await
        .unwrap();
    wait_for(&api_a, "allowed", "Ready", |p| {
        phase(p) == Some(Phase::Ready)
    })
    .await;

    // Without the policy (deleted, or never installed), the controller refuses: a condition
    // naming the field, the rule and the fix; no instance at the provider.
    write_policy(&admin, &name, &[]).await.unwrap();
    await_admission(cp, &in_b, false).await;
    apply(cp, &in_b, false).await.unwrap();
    apply(cp, &with_user_data, false).await.unwrap();
    let api_b: Api<Proxy> = team_b.api();
    let denied = |p: Option<&Proxy>| {
        condition(p, "AccessAllowed").is_some_and(|(s, r, _)| s == "False" && r == "AccessDenied")
    };
    let proxy_b = wait_for(&api_b, "in-b", "AccessDenied", denied)
        .await
        .unwrap();
    let (_, _, message) = condition(Some(&proxy_b), "Ready").unwrap();
    assert!(
        message.starts_with(&format!(
            "spec.provider: namespace `{b}` may not use provider instance `{provider}`"
        )) && message.contains("ask the platform team"),
        "{message}"
    );
    assert_eq!(phase(Some(&proxy_b)), Some(Phase::Pending));
    let proxy_a = wait_for(&api_a, "with-user-data", "AccessDenied", denied)
        .await
        .unwrap();
    let (_, _, message) = condition(Some(&proxy_a), "AccessAllowed").unwrap();
    assert!(message.starts_with("spec.cloudInit: "), "{message}");
    let made: Vec<String> = store
        .state
        .instances
        .lock()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    let allowed = api_a.get("allowed").await.unwrap();
    assert_eq!(
        made,
        [instance_name(&allowed.metadata.uid.unwrap())],
        "only the allowed Proxy's instance exists"
    );
    let events = events_of(cp, &team_b).await;
    assert!(
        events.iter().any(|e| e["reason"] == "AccessDenied"),
        "an AccessDenied event: {events:?}"
    );

    // The pool controller makes no member of a pool over the instance's limit.
    let pools = proxy_operator::lifecycle::pool::PoolContext::new(
        operator_account(cp),
        providers.clone(),
        Arc::new(LeaseStore::new(
            LeaseOptions::default(),
            LeaseMetrics::register(&prometheus::Registry::new()).unwrap(),
            None,
        )),
        // The Proxies' cache the caps read: empty, the refusal comes before them.
        kube::runtime::reflector::store::<Proxy>().0,
    );
    let namespace = a.to_string();
    let pool_task = tokio::spawn(async move {
        proxy_operator::lifecycle::pool::run_until(
            Arc::new(pools),
            Some(&namespace),
            std::future::pending(),
        )
        .await
    });
    apply(cp, &big_pool, false).await.unwrap();
    let pools_api: Api<ProxyPool> = team_a.api();
    let deadline = Instant::now() + Duration::from_secs(60);
    let ready = loop {
        let pool = pools_api.get("big").await.unwrap();
        let ready = pool
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready").cloned());
        if let Some(ready) = ready.filter(|c| c.reason == "AccessDenied") {
            break ready;
        }
        assert!(
            Instant::now() < deadline,
            "the pool was not refused: {pool:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    pool_task.abort();
    assert!(ready.message.starts_with("spec.replicas: "), "{ready:?}");
    assert_eq!(
        api_a.list(&Default::default()).await.unwrap().items.len(),
        2
    );
}

/// The operator binary's leader keeps `<operator-id>-provider-access` as its providers config
/// says: applied at start, rewritten when the config allows another namespace, deleted when no
/// instance has `access` any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_keeps_the_admission_policy_as_the_providers_config_changes() {
    let world = super::world::World::start("access-bin").await;
    let cp = world.cp;
    let other = cp.namespace("access-other").await.unwrap();
    let (own, other) = (world.ns.name(), other.name());
    // An instance name of its own, as above: the policy is cluster-wide.
    let provider = format!("acc-{}", own.trim_start_matches("access-bin-"));
    let write_config = |access: &str| {
        let entry = store_provider(&provider, &world.store);
        std::fs::write(&world.config, format!("providers:\n{entry}{access}")).unwrap();
    };
    write_config(&format!("  access: {{namespaces: [{own}]}}\n"));
    let _operator = world
        .operator_with(&["--providers-config-reload-interval", "200ms"])
        .await;
    let name = policy::name(&format!("e2e-{own}"));

    let in_other = plain_proxy(other, "elsewhere", &provider);
    await_admission(cp, &in_other, true).await;
    let refused = apply(cp, &in_other, true).await.unwrap_err();
    assert!(
        refused.contains(&format!(
            "spec.provider: this namespace may not use provider instance `{provider}`"
        )),
        "{refused}"
    );
    apply(cp, &plain_proxy(own, "at-home", &provider), false)
        .await
        .expect("its own namespace may use it");
    let api: Api<Proxy> = world.ns.api();
    let made = wait_for(&api, "at-home", "made", |p| {
        p.and_then(|p| p.status.as_ref())
            .is_some_and(|s| s.provider_id.is_some())
    })
    .await
    .unwrap();
    let instance = made.status.unwrap().provider_id.unwrap();

    write_config(&format!("  access: {{namespaces: [{own}, {other}]}}\n"));
    await_admission(cp, &in_other, false).await;
    let with_user_data = proxy_yaml(other, "with-user-data", &provider, "");
    let refused = apply(cp, &with_user_data, true).await.unwrap_err();
    assert!(refused.contains("spec.cloudInit: "), "{refused}");

    // Its own namespace loses access: the running Proxy is told so, and keeps running.
    write_config(&format!("  access: {{namespaces: [{other}]}}\n"));
    let denied = |p: Option<&Proxy>| {
        condition(p, "AccessAllowed").is_some_and(|(s, r, _)| s == "False" && r == "AccessDenied")
    };
    let marked = wait_for(&api, "at-home", "AccessDenied", denied)
        .await
        .unwrap();
    let (_, _, message) = condition(Some(&marked), "AccessAllowed").unwrap();
    assert!(
        message.contains(&format!(
            "namespace `{own}` may not use provider instance `{provider}`"
        )) && message.contains("the proxy keeps running"),
        "{message}"
    );
    assert!(marked.metadata.deletion_timestamp.is_none());
    assert!(
        world
            .store
            .state
            .instances
            .lock()
            .unwrap()
            .contains_key(&instance)
    );

    // No `access` left: no policy (every namespace, everything, as before `access` existed).
    write_config("");
    await_admission(cp, &with_user_data, false).await;
    let gone = cp
        .kubectl_run(&["get", "validatingadmissionpolicy", &name], None)
        .await
        .unwrap_err();
    assert!(format!("{gone:#}").contains("NotFound"), "{gone:#}");
    wait_for(&api, "at-home", "AccessAllowed gone", |p| {
        p.is_some() && condition(p, "AccessAllowed").is_none()
    })
    .await;
    write_policy(&cp.client(), &name, &[]).await.unwrap();
}

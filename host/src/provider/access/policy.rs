//! The `ValidatingAdmissionPolicy` (and its binding) that refuses, at `kubectl apply`, what
//! `access::check` refuses in the controllers: generated from the providers config, one CEL
//! validation per (instance, rule), each with a message naming the field and the rule. No I/O;
//! `lifecycle::access_policy` keeps it applied.

use serde_json::{Value, json};

use super::Rules;

/// The policy's and the binding's name for an operator installation.
pub fn name(operator_id: &str) -> String {
    format!("{operator_id}-provider-access")
}

/// The policy and its binding for these rules; `None` when no instance restricts anything (a
/// policy needs at least one validation, so there is none to keep).
pub fn manifests(name: &str, rules: &[Rules]) -> Option<(Value, Value)> {
    let mut validations = Vec::new();
    for rules in rules {
        validations.extend(for_kind(Kind::Proxy, rules));
        validations.extend(for_kind(Kind::Pool, rules));
    }
    if validations.is_empty() {
        return None;
    }
    let labels = json!({"app.kubernetes.io/managed-by": "proxy-operator"});
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["proxy-operator.dev"],
                "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["proxies", "proxypools"],
            }]},
            // An update that leaves the spec alone (the operator removing its finalizer from a
            // Proxy whose namespace lost its access) is never refused: it would block deletion.
            "matchConditions": [{
                "name": "spec-written",
                "expression": "request.operation == 'CREATE' || object.spec != oldObject.spec",
            }],
            "validations": validations,
        },
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": labels},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    });
    Some((policy, binding))
}

#[derive(Clone, Copy)]
enum Kind {
    Proxy,
    Pool,
}

impl Kind {
    fn resource(self) -> &'static str {
        match self {
            Kind::Proxy => "proxies",
            Kind::Pool => "proxypools",
        }
    }
    /// Where the Proxy spec is, in CEL and as the messages name it.
    fn spec(self) -> (&'static str, &'static str) {
        match self {
            Kind::Proxy => ("object.spec", "spec."),
            Kind::Pool => ("object.spec.template.spec", "spec.template.spec."),
        }
    }
    /// Whether the object names the instance `p` (a pool: in its template or any spread entry,
    /// as `access::pool_providers`).
    fn uses(self, p: &str) -> String {
        match self {
            Kind::Proxy => format!("object.spec.provider == {}", quote(p)),
            Kind::Pool => format!(
                "(object.spec.template.spec.provider == {q} || (has(object.spec.spread) && object.spec.spread.exists(s, has(s.provider) && s.provider == {q})))",
                q = quote(p)
            ),
        }
    }
    fn provider_field(self) -> &'static str {
        match self {
            Kind::Proxy => "spec.provider",
            Kind::Pool => "spec.template.spec.provider (or spec.spread[].provider)",
        }
    }
}

/// One validation per rule of `rules` for one kind: `expression` holds unless the object names
/// the instance and breaks the rule.
fn for_kind(kind: Kind, rules: &Rules) -> Vec<Value> {
    let p = &rules.provider;
    let (s, at) = kind.spec();
    let mut checks: Vec<(String, String)> = vec![(
        namespace_allowed(rules),
        format!(
            "{}: this namespace may not use provider instance `{p}` (its access in the providers config allows {}); use a provider instance your namespace may use, or ask the platform team to add the namespace",
            kind.provider_field(),
            super::allowed_namespaces(rules)
        ),
    )];
    let allow = &rules.allow;
    if !allow.user_data {
        checks.push((
            format!("!has({s}.cloudInit)"),
            format!("{at}cloudInit: provider instance `{p}` does not allow user cloud-init (access.allow.userData is false); remove it, or ask the platform team to set access.allow.userData"),
        ));
    }
    if !allow.vendor_data {
        checks.push((
            format!("!has({s}.vendorData)"),
            format!("{at}vendorData: provider instance `{p}` does not allow vendor data (access.allow.vendorData is false); remove it, or ask the platform team to set access.allow.vendorData"),
        ));
    }
    if !allow.unmanaged_squid {
        checks.push((
            format!("!has({s}.providerOptions) || !has({s}.providerOptions.managedSquid) || {s}.providerOptions.managedSquid == true"),
            format!("{at}providerOptions.managedSquid: provider instance `{p}` keeps squid managed (access.allow.unmanagedSquid is false); remove it, or ask the platform team to set access.allow.unmanagedSquid"),
        ));
    }
    let types: Vec<String> = allow.service_types.iter().map(|t| quote(t)).collect();
    checks.push((
        format!(
            "!has({s}.providerOptions) || !has({s}.providerOptions.serviceType) || {s}.providerOptions.serviceType in [{}]",
            types.join(", ")
        ),
        format!(
            "{at}providerOptions.serviceType: provider instance `{p}` allows the Service types [{}] only (access.allow.serviceTypes); use one of them, or ask the platform team to add it",
            allow.service_types.join(", ")
        ),
    ));
    if let (Kind::Pool, Some(max)) = (kind, allow.max_pool_replicas) {
        checks.push((
            format!("object.spec.replicas <= {max}"),
            format!("spec.replicas: provider instance `{p}` allows pools of at most {max} (access.allow.maxPoolReplicas); lower it, or ask the platform team to raise access.allow.maxPoolReplicas"),
        ));
    }
    checks
        .into_iter()
        .map(|(rule, message)| {
            json!({
                "expression": format!(
                    "request.resource.resource != '{}' || !({}) || ({rule})",
                    kind.resource(),
                    kind.uses(p)
                ),
                "message": message,
                "reason": "Forbidden",
            })
        })
        .collect()
}

/// The CEL that holds when the request's namespace may use the instance.
fn namespace_allowed(rules: &Rules) -> String {
    let mut any = Vec::new();
    if !rules.namespaces.is_empty() {
        let names: Vec<String> = rules.namespaces.iter().map(|n| quote(n)).collect();
        any.push(format!("request.namespace in [{}]", names.join(", ")));
    }
    if let Some(selector) = &rules.selector {
        let labels = "namespaceObject.metadata.labels";
        let mut all = vec![format!("has({labels})")];
        for (key, value) in selector {
            all.push(format!(
                "{k} in {labels} && {labels}[{k}] == {v}",
                k = quote(key),
                v = quote(value)
            ));
        }
        any.push(if selector.is_empty() {
            "true".into()
        } else {
            format!("({})", all.join(" && "))
        });
    }
    if any.is_empty() {
        return "false".into();
    }
    any.join(" || ")
}

/// A CEL string literal.
fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\\', "\\\\").replace('\'', "\\'"))
}

//! The operator's own objects, which no plugin may create, change or delete whatever namespace
//! it is granted: a plugin that could write the plugins ConfigMap would load code for every
//! provider, and one that could write the lease table or the leader Lease would hand out or
//! stop the operator's work. The label check alone does not cover them, because an object that
//! does not exist yet (a plugins ConfigMap not yet made) has no owner to compare.

/// One object of the operator's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorObject {
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

impl OperatorObject {
    /// The lease table's journal segments and checkpoint parts are named after it
    /// (`<table>-j-…`, `<table>-c…`, persist.rs): they are the table too.
    fn covers_as_part(&self, name: &str) -> bool {
        self.kind == "ConfigMap"
            && self.name.ends_with("-leases")
            && name
                .strip_prefix(self.name.as_str())
                .is_some_and(|rest| rest.starts_with("-j-") || rest.starts_with("-c"))
    }
}

/// The objects no plugin may touch, and the operator's own namespace (which no grant may name).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OperatorObjects {
    objects: Vec<OperatorObject>,
    home: Option<String>,
}

impl OperatorObjects {
    /// The objects of the operator `operator_id` in `namespace` (its own): the lease table, the
    /// abandoned-instance record, the leader Lease and the providers config's ConfigMap, plus the
    /// plugins ConfigMap wherever it is.
    pub fn of(
        operator_id: &str,
        namespace: &str,
        providers_configmap: &str,
        plugins_configmap: Option<(&str, &str)>,
    ) -> Self {
        let configmap = |namespace: &str, name: String| OperatorObject {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: namespace.into(),
            name,
        };
        let mut objects = vec![
            configmap(namespace, format!("{operator_id}-leases")),
            configmap(namespace, format!("{operator_id}-abandoned")),
            configmap(namespace, providers_configmap.to_string()),
            OperatorObject {
                api_version: "coordination.k8s.io/v1".into(),
                kind: "Lease".into(),
                namespace: namespace.into(),
                name: format!("{operator_id}-leader"),
            },
        ];
        if let Some((namespace, name)) = plugins_configmap {
            objects.push(configmap(namespace, name.to_string()));
        }
        OperatorObjects {
            objects,
            home: Some(namespace.to_string()),
        }
    }

    /// The operator's own namespace: a plugin granted it could label a Pod like the operator's
    /// and join its Services (the discovery API, with the crawlers' bearer tokens).
    pub fn home(&self) -> Option<&str> {
        self.home.as_deref()
    }

    /// Whether the object is one of the operator's.
    pub fn contains(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> bool {
        self.objects.iter().any(|o| {
            o.api_version == api_version
                && o.kind == kind
                && o.namespace == namespace
                && (o.name == name || o.covers_as_part(name))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operators_objects_are_named_by_its_id_and_flags() {
        let objects = OperatorObjects::of(
            "po",
            "proxy-operator",
            "providers-config",
            Some(("proxy-operator", "plugins")),
        );
        for (api_version, kind, name) in [
            ("v1", "ConfigMap", "po-leases"),
            ("v1", "ConfigMap", "po-leases-j-000000000007"),
            ("v1", "ConfigMap", "po-leases-c3-0"),
            ("v1", "ConfigMap", "po-abandoned"),
            ("v1", "ConfigMap", "providers-config"),
            ("v1", "ConfigMap", "plugins"),
            ("coordination.k8s.io/v1", "Lease", "po-leader"),
        ] {
            assert!(
                objects.contains(api_version, kind, "proxy-operator", name),
                "{name}"
            );
        }
        assert!(!objects.contains("v1", "ConfigMap", "crawlers", "plugins"));
        assert!(!objects.contains("v1", "ConfigMap", "proxy-operator", "px-1-squid"));
        assert!(!objects.contains("v1", "Pod", "proxy-operator", "po-leases"));
        assert!(!objects.contains("v1", "ConfigMap", "proxy-operator", "po-leases-other"));
        assert!(!objects.contains("v1", "ConfigMap", "proxy-operator", "po-abandoned-j-1"));
    }
}
